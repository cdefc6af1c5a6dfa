"""The fused output head against the whole logits: one packed PPO update with Qwen's 152K vocabulary.

Usage: .venv/bin/python bench/bench_fused_head.py [--tokens 8192,16384,32768] [--unfused-max 16384] [--repeats 2]
       .venv/bin/python bench/bench_fused_head.py --tokens 8192 --chunks 128,441,1024,2048   (the fused head's chunk)

A random Qwen2 with Qwen2-7B's vocabulary (152,064, untied head) and a small body (2 layers, hidden 256, 4 / 2
heads, MLP 512: the head is 39M of its 79M parameters, so the head decides the memory) goes through
FSDPPolicyEngine's update on one gloo rank, float32 as on the CPU: one micro-batch of `tokens` tokens (four sequences
of 256 prompt tokens and the rest response, packed into one row), the on-policy step with an entropy bonus
(the entropy's gradient through the head too). Each case runs in a process of its own: seconds per token (median of
`--repeats` updates after one warm-up) and the peak resident memory above the process's after loading. Fused and
unfused alternate at each length; past `--unfused-max` only the fused head runs (in float32 the whole logits of 16K
tokens, their gradient and a slice's gradient widened to them are 26 GiB: more than a 24 GiB machine has), beside what `or1 plan`'s terms
count for the unfused update at that length. With `--chunks` only the fused head runs, once per chunk size (positions
per chunk; `actor.head_chunk_tokens`), to choose its default. The last line is a JSON list of the cases.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_rollout import random_qwen2  # noqa: E402

SHAPE = {
    "hidden_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 512,
    "vocab_size": 152064,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
}
PROMPT, SEQUENCES = 256, 4
GIB = 2**30


def rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB  # Linux: KiB


def current_rss_gib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024 / GIB
    raise RuntimeError("no VmRSS in /proc/self/status")


def batch(tokens: int):
    """SEQUENCES sequences of PROMPT + response tokens adding up to `tokens`, random ids, advantages of both signs."""
    from or1.hybrid.batch import Batch
    from or1.workers.rollout_rows import pack_sequences

    g = torch.Generator().manual_seed(0)
    response = tokens // SEQUENCES - PROMPT
    prompts = [torch.randint(3, 150000, (PROMPT,), generator=g).tolist() for _ in range(SEQUENCES)]
    responses = [torch.randint(3, 150000, (response,), generator=g).tolist() for _ in range(SEQUENCES)]
    t = pack_sequences(prompts, responses, PROMPT, response, pad_id=1)
    t["advantages"] = torch.tensor([[1.0], [-1.0], [0.5], [-0.5]])
    return Batch(t)


def run_case(model_dir: str, tokens: int, fused: bool, repeats: int, chunk: int | None) -> dict:
    import torch.distributed as dist

    from or1.algos.losses import LossConfig
    from or1.engines.fsdp_actor import FSDPPolicyEngine
    from or1.engines.train_settings import TrainSettings

    with tempfile.NamedTemporaryFile() as init:
        dist.init_process_group("gloo", init_method=f"file://{init.name}", rank=0, world_size=1)
    settings = TrainSettings(
        lr=1e-6,
        remove_padding=True,
        max_tokens_per_micro_batch=tokens,
        fused_head=fused,
        head_chunk_tokens=chunk,  # None: the default, as or1 train runs it
    )
    engine = FSDPPolicyEngine(model_dir, settings)
    work = batch(tokens)
    base = current_rss_gib()
    seconds = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        engine.train_step(work, LossConfig(), temperature=1.0, entropy_coef=0.01)
        seconds.append(time.perf_counter() - start)
    return {
        "tokens": tokens,
        "fused": fused,
        "chunk": chunk,
        "s_per_token": statistics.median(seconds[1:]) / tokens,
        "peak_gib": rss_gib() - base,
    }


def planned_gib(tokens: int, fused: bool, chunk: int | None = None) -> float:
    """What or1 plan's terms count for this update above the loaded parameters (float32, one rank): gradients and
    AdamW moments, the saved activations and the backward's transients, with the whole logits or the fused head."""
    from or1.plan import memory
    from or1.plan.model import read_model_shape

    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps({"model_type": "qwen2", **SHAPE}))
        shape = read_model_shape(Path(folder))
    scored = SEQUENCES * (tokens // SEQUENCES - PROMPT)
    window = memory.Window(tokens=tokens, logits=scored, scored=scored)
    chunk = (chunk or memory.fused_head_chunk(shape)) if fused else None
    saved = memory.saved_activations(
        shape,
        window,
        compute_bytes=4,
        checkpointing=False,
        entropy_grad=True,
        extra_copy=True,
        head_chunk=chunk,
    )
    shards = memory.ShardState.of(shape, 1)
    backward = memory.backward_extra(shape, window, compute_bytes=4, entropy_grad=True, head_chunk=chunk)
    return (shards.gradients + shards.optimizer + saved.total + backward) / GIB


def table(rows: list[dict]) -> str:
    """Markdown: each case beside the plan's count, and fused over whole at each length both ran."""
    lines = [
        "| tokens | head | s / 1K tokens | peak GiB above load | or1 plan GiB | fused / whole: time | peak |",
        "|---|---|---|---|---|---|---|",
    ]
    for tokens in sorted({r["tokens"] for r in rows}):
        by_head = {r["fused"]: r for r in rows if r["tokens"] == tokens}
        for fused in (True, False):
            r, plan, head = (
                by_head.get(fused),
                f"{planned_gib(tokens, fused):.2f}",
                "fused" if fused else "whole",
            )
            if r is None or "error" in r:
                why = "not run" if r is None else f"failed: {r['error'][-80:]}"
                lines.append(f"| {tokens:,} | {head} | {why} | | {plan} | | |")
                continue
            ratio, other = " | ", by_head.get(True)
            if not fused and other is not None and "error" not in other:
                ratio = (
                    f"{other['s_per_token'] / r['s_per_token']:.2f} | {other['peak_gib'] / r['peak_gib']:.2f}"
                )
            cells = f"{r['s_per_token'] * 1000:.2f} | {r['peak_gib']:.2f} | {plan} | {ratio}"
            lines.append(f"| {tokens:,} | {head} | {cells} |")
    return "\n".join(lines)


def chunk_table(rows: list[dict]) -> str:
    """Markdown: the fused head at each chunk size."""
    lines = [
        "| tokens | chunk | s / 1K tokens | peak GiB above load | or1 plan GiB |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        plan = planned_gib(r["tokens"], True, r["chunk"])
        cells = "failed" if "error" in r else f"{r['s_per_token'] * 1000:.2f} | {r['peak_gib']:.2f}"
        lines.append(f"| {r['tokens']:,} | {r['chunk'] or 'default'} | {cells} | {plan:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="8192,16384,32768")
    parser.add_argument("--unfused-max", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--chunks", help="the fused head only, at these chunk sizes (positions)")
    # model_dir tokens fused chunk: one case, in this process
    parser.add_argument("--case", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        model_dir, tokens, fused, chunk = args.case
        print(json.dumps(run_case(model_dir, int(tokens), fused == "1", args.repeats, int(chunk) or None)))
        return
    chunks = [int(c) for c in args.chunks.split(",")] if args.chunks else [0]
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        random_qwen2(Path(folder), SHAPE)
        for tokens in map(int, args.tokens.split(",")):
            heads = (True, False) if tokens <= args.unfused_max and not args.chunks else (True,)
            for fused, chunk in ((f, c) for f in heads for c in (chunks if f else [0])):
                case = [folder, str(tokens), "1" if fused else "0", str(chunk)]
                cmd = [sys.executable, __file__, "--repeats", str(args.repeats), "--case", *case]
                done = subprocess.run(cmd, capture_output=True, text=True)
                what = {"tokens": tokens, "fused": fused, "chunk": chunk or None}
                if done.returncode == -9:  # the kernel's OOM killer: the case needs more memory than there is
                    rows.append(what | {"error": "killed: out of memory"})
                elif done.returncode != 0:
                    rows.append(what | {"error": done.stderr.strip()[-300:]})
                else:
                    rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
                print(rows[-1], flush=True)
    print("\n" + (chunk_table(rows) if args.chunks else table(rows)))
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
