"""Validation during training: the recipe's validation sets, n samples at each temperature, logged as avg@n.

Generation goes through the actor group's rollout path (the same weights sync as training) and scoring through
the reward manager, so validation measures exactly the policy being trained, with the same verifiers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from or1.config.schema import RunConfig, ValidationSetConfig
from or1.data.benchmarks import load_benchmark
from or1.errors import UserError
from or1.hybrid.batch import Batch
from or1.hybrid.columns import (
    ABILITY,
    PROMPT_IDS,
    RESPONSE_MASK,
    REWARD_COLUMNS,
    REWARD_MODEL,
    SCORES,
    TRUNCATED,
    UID,
)
from or1.hybrid.dispatch import balanced_order
from or1.hybrid.sampling import SamplingRequest
from or1.hybrid.worker_group import WorkerGroup
from or1.run_metrics import validation_accuracy, validation_truncated
from or1.scoring import RewardManager
from or1.tokens import prompt_ids


@dataclass
class ValidationSet:
    name: str
    prompts: Batch  # non-tensor: prompt_ids, uid, ability, reward_model
    too_long: int  # prompts dropped for exceeding data.max_prompt_length
    n: int  # samples per problem: avg@n
    max_response_length: int | None  # None: the recipe's validation budget


def load_validation_sets(cfg: RunConfig, tokenizer: PreTrainedTokenizerBase) -> list[ValidationSet]:
    """Resolve data.validation.sets (benchmark names or or1-row files) into encoded prompt batches."""
    val = cfg.data.validation
    sets = []
    for entry in val.sets:
        spec = entry if isinstance(entry, ValidationSetConfig) else ValidationSetConfig(set=entry)
        data = load_benchmark(spec.set)
        rows = data.rows[: val.max_problems] if val.max_problems else data.rows
        encoded = [(row, prompt_ids(tokenizer, row["prompt"])) for row in rows]
        kept = [(row, ids) for row, ids in encoded if len(ids) <= cfg.data.max_prompt_length]
        if not kept:
            raise UserError(
                f"data.validation.sets: {spec.set} has no prompt within data.max_prompt_length="
                f"{cfg.data.max_prompt_length} tokens"
            )
        # A set ordered by difficulty (as benchmark files often are) would give one rank all the long problems.
        kept = [kept[i] for i in balanced_order([len(ids) for _, ids in kept], cfg.world_size)]
        columns = {
            PROMPT_IDS: [ids for _, ids in kept],
            UID: [f"val-{i}" for i in range(len(kept))],
            ABILITY: [row["ability"] for row, _ in kept],
            REWARD_MODEL: [dict(row["reward_model"]) for row, _ in kept],
        }
        n, max_response_length = spec.n or val.n, spec.max_response_length or val.max_response_length
        sets.append(
            ValidationSet(
                data.name, Batch.from_dict(columns), len(encoded) - len(kept), n, max_response_length
            )
        )
    names = [vset.name for vset in sets]
    until = cfg.trainer.until
    for key, rule in (("plateau", until.plateau), ("target", until.target)):
        if rule is not None and rule.set is not None and names and rule.set not in names:
            raise UserError(
                f"trainer.until.{key}.set: {rule.set} is not one of the stage's validation sets ({', '.join(names)}); "
                "name one of them, or drop the rules with --set trainer.until={}"
            )
    return sets


def validate(
    sets: list[ValidationSet], actor: WorkerGroup, rewards: RewardManager, cfg: RunConfig
) -> dict[str, float]:
    """avg@n, truncation and mean length of every set at every configured temperature, each set at its own n.

    Every stage samples a set at the same budget (its own, else data.validation.max_response_length), so a stage
    switch changes the curve only through the policy, not through a longer or shorter response budget.
    """
    val = cfg.data.validation
    metrics: dict[str, float] = {}
    for vset in sets:
        max_response_length = vset.max_response_length or cfg.rollout.max_response_length
        for temperature in val.temperatures:
            # No step: every validation samples with the same seeds (common random numbers), so the difference
            # between two validations is the models', not the dice's.
            request = SamplingRequest(
                vset.n, temperature, val.top_p, max_response_length, cfg.trainer.seed, step=None
            )
            out = actor.generate_sequences(vset.prompts, request)
            scores = rewards.compute_scores(out.only(REWARD_COLUMNS)).tensors[SCORES]
            accuracy = validation_accuracy(vset.name, temperature, vset.n)
            prefix = accuracy.rsplit("/", 1)[0]
            metrics[accuracy] = float(scores.mean())
            metrics[validation_truncated(accuracy)] = float(out.tensors[TRUNCATED].float().mean())
            metrics[f"{prefix}/length_mean"] = float(
                out.tensors[RESPONSE_MASK].sum(-1).to(torch.float32).mean()
            )
    return metrics


def is_due(cfg: RunConfig, step: int) -> bool:
    """Every data.validation.every steps (0: never mid-stage) and always at the stage's last step."""
    every = cfg.data.validation.every
    return step == cfg.trainer.steps or (every > 0 and step % every == 0)
