"""Supervised warm start of the tiny model on solved arithmetic and on programs (loss on response tokens only).

The schedule (measured on the tiny world): AdamW at 2.5e-3, 30 warm-up steps, then linear decay to 0.1x (decay mattered: the
same budget without it solved a quarter as much). It runs a fixed number of steps so the result is deterministic
from the seed, not from the machine's speed.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from or1.data.synthetic_code import CODE_SFT_STEPS, task_stream
from or1.data.synthetic_math import problem_stream
from or1.tokens import prompt_ids

IGNORE_INDEX = -100  # label value the loss skips: prompt and padding tokens


@dataclass(frozen=True)
class SFTConfig:
    """Warm-start settings; the defaults are the tiny preset's."""

    steps: int = 600
    batch_size: int = 32
    lr: float = 2.5e-3
    warmup_steps: int = 30
    final_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    ops: tuple[int, ...] = (2, 3, 4, 5, 6)
    code_share: float = 0.5  # of each batch: programs (tiny code tasks); the rest is arithmetic
    # of the programs: written with one slip (a line of another step), so that the base knows the right program
    # (greedy) but slips now and then when sampling at T=1, as the arithmetic base does: the frontier RL moves
    code_slip: float = 0.3
    code_steps: tuple[int, ...] = CODE_SFT_STEPS


FIRST_LOSSES = (
    20  # the warm start's first losses, kept in the report: two machines' builds show where they part
)


@dataclass(frozen=True)
class SFTReport:
    steps: int
    seconds: float
    final_loss: float  # mean over the last 20 steps
    first_losses: tuple[float, ...] = ()  # the first FIRST_LOSSES steps' losses, exactly as computed


def lr_factor(step: int, cfg: SFTConfig) -> float:
    """Multiplier of cfg.lr at `step` (0-based): linear warm-up, then linear decay to cfg.final_lr_ratio."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps - 1)
    done = min(1.0, (step - cfg.warmup_steps) / span)
    return 1.0 - (1.0 - cfg.final_lr_ratio) * done


def sft_examples(seed: int, cfg: SFTConfig) -> Iterator[list[tuple[str, str]]]:
    """Endless batches of (prompt, response): round(code_share * batch_size) programs (a code_slip share of them
    with one slip), the rest arithmetic with its gold worked solution."""
    math = problem_stream(seed, cfg.ops)
    code = task_stream(seed, cfg.code_steps)
    rng = random.Random(seed)
    n_code = round(cfg.code_share * cfg.batch_size)
    while True:
        pairs = [(p.prompt, p.solution) for p in itertools.islice(math, cfg.batch_size - n_code)]
        for task in itertools.islice(code, n_code):
            slip = rng.random() < cfg.code_slip
            pairs.append((task.prompt, task.slipped_response(rng) if slip else task.response))
        yield pairs


def sft_batch(
    tokenizer: PreTrainedTokenizerBase, examples: Sequence[tuple[str, str]]
) -> dict[str, torch.Tensor]:
    """Right-padded input_ids / attention_mask / labels for gold responses ended by eos; labels mask the prompt."""
    prompts = [prompt_ids(tokenizer, [{"role": "user", "content": prompt}]) for prompt, _ in examples]
    answers = tokenizer(
        [response + tokenizer.eos_token for _, response in examples], add_special_tokens=False
    )["input_ids"]
    width = max(len(a) + len(b) for a, b in zip(prompts, answers, strict=True))
    ids = torch.full((len(examples), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for i, (prompt, answer) in enumerate(zip(prompts, answers, strict=True)):
        n = len(prompt) + len(answer)
        ids[i, :n] = torch.tensor(prompt + answer)
        labels[i, len(prompt) : n] = torch.tensor(answer)
        mask[i, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def warm_start(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    seed: int,
    cfg: SFTConfig = SFTConfig(),
    console: Console | None = None,
) -> SFTReport:
    """Train `model` in place on gold worked solutions and programs (never validation problems), with a progress bar."""
    torch.manual_seed(seed)
    stream = sft_examples(seed, cfg)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg))
    model.train()
    losses: list[float] = []
    start = time.perf_counter()
    columns = (
        TextColumn("warm start"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:.3f}"),
        TextColumn("lr {task.fields[lr]:.1e}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console or Console(), transient=False) as progress:
        task = progress.add_task("sft", total=cfg.steps, loss=float("nan"), lr=cfg.lr)
        for _ in range(cfg.steps):
            batch = sft_batch(tokenizer, next(stream))
            loss = model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            losses.append(loss.item())
            progress.update(
                task, advance=1, loss=sum(losses[-20:]) / len(losses[-20:]), lr=scheduler.get_last_lr()[0]
            )
    model.eval()
    tail = losses[-20:]
    return SFTReport(
        steps=cfg.steps,
        seconds=time.perf_counter() - start,
        final_loss=sum(tail) / len(tail),
        first_losses=tuple(losses[:FIRST_LOSSES]),
    )
