"""One packed update (forward + backward) at growing row sizes: or1's packed attention against the dense mask.

Usage: .venv/bin/python bench/bench_attention.py [--sizes 4096,8192,16384,32768] [--sequence 512] [--threads 1]

A packed row of fixed-length sequences (`--sequence` tokens each, position ids restarting per sequence) goes
forward and backward through a small random Qwen2 (2 layers, hidden 128, 4 query / 2 key-value heads), once per
path and size, each in a fresh process on `--threads` threads after a warm-up pass on a short row:
- **dense**: transformers' sdpa, which builds the [T, T] block-causal mask from the position ids (or1's packed path
  before engines/varlen.py);
- **packed**: or1's attention from the sequences' boundaries (`engines/varlen.py`, the CPU's per-segment kernel).
Printed per path and size: seconds and seconds per 1K tokens, and the pass's peak memory (the process's peak
resident set during the pass over its resident set before it) in MiB and KiB per token; then, for the packed
path, seconds per token at the largest size over the smallest, and the largest size's peak over the straight line
through the two smallest sizes' peaks (linear growth: 1.0); and the dense path's seconds over the packed one's at
each size. The last line is the rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

SHAPE = {
    "vocab_size": 1024,
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 256,
    "max_position_embeddings": 65536,
}
PATHS = ("dense", "packed")
WARM_UP_TOKENS = 2048


def status_kib(field: str) -> int:
    """A memory figure of this process from /proc/self/status (VmRSS: now, VmHWM: the peak since the last reset)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def one_pass(path: str, tokens: int, sequence: int, threads: int) -> dict:
    """Build the model, warm up, then time one forward + backward of a `tokens`-long packed row (this process)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from or1.engines import varlen
    from or1.engines.varlen import Segments

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**SHAPE, attn_implementation="sdpa"))
    if path == "packed":
        varlen.enable(model)

    def run(length: int) -> None:
        lengths = (sequence,) * (length // sequence)
        ids = torch.randint(0, SHAPE["vocab_size"], (1, length))
        positions = torch.cat([torch.arange(n) for n in lengths])[None]
        extra = {"segments": Segments(lengths)} if path == "packed" else {}
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=ids, position_ids=positions, use_cache=False, **extra).logits
        torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:]).backward()

    run(min(tokens, WARM_UP_TOKENS))
    model.zero_grad(set_to_none=True)
    Path("/proc/self/clear_refs").write_text("5")  # the peak resident set starts again from now
    before = status_kib("VmRSS")
    start = time.perf_counter()
    run(tokens)
    seconds = time.perf_counter() - start
    peak_kib = status_kib("VmHWM") - before
    return {
        "path": path,
        "tokens": tokens,
        "seconds": round(seconds, 3),
        "ms_per_1k_tokens": round(1000 * seconds / tokens * 1000, 2),
        "peak_mib": round(peak_kib / 1024, 1),
        "peak_kib_per_token": round(peak_kib / tokens, 2),
    }


def in_fresh_process(path: str, tokens: int, sequence: int, threads: int) -> dict:
    args = ["--one", path, "--sizes", str(tokens), "--sequence", str(sequence), "--threads", str(threads)]
    out = subprocess.run([sys.executable, __file__, *args], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def summary(rows: list[dict]) -> list[str]:
    """The ratios the issue's targets read: packed time per token and peak growth, and dense over packed."""
    packed = sorted((r for r in rows if r["path"] == "packed"), key=lambda r: r["tokens"])
    dense = {r["tokens"]: r for r in rows if r["path"] == "dense"}
    lines = []
    if len(packed) >= 2:
        small, large = packed[0], packed[-1]
        ratio = large["ms_per_1k_tokens"] / small["ms_per_1k_tokens"]
        lines.append(
            f"packed: seconds per token at {large['tokens']:,} / at {small['tokens']:,} tokens = {ratio:.2f}"
        )
    if len(packed) >= 3:
        a, b, large = packed[0], packed[1], packed[-1]
        slope = (b["peak_mib"] - a["peak_mib"]) / (b["tokens"] - a["tokens"])
        line = a["peak_mib"] + slope * (large["tokens"] - a["tokens"])
        lines.append(
            f"packed: peak at {large['tokens']:,} tokens / the line through {a['tokens']:,} and "
            f"{b['tokens']:,} = {large['peak_mib']:.0f} / {line:.0f} MiB = {large['peak_mib'] / line:.2f}"
        )
    for row in packed:
        if row["tokens"] in dense:
            old = dense[row["tokens"]]
            lines.append(
                f"dense / packed at {row['tokens']:,} tokens: time {old['seconds'] / row['seconds']:.1f}x, "
                f"peak memory {old['peak_mib'] / max(row['peak_mib'], 0.1):.1f}x"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="4096,8192,16384,32768", help="packed row lengths in tokens")
    parser.add_argument("--sequence", type=int, default=512, help="tokens per packed sequence")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--paths", default=",".join(PATHS))
    # internal: a single measurement, in this process
    parser.add_argument("--one", choices=PATHS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.one:
        print(json.dumps(one_pass(args.one, sizes[0], args.sequence, args.threads)))
        return
    rows = []
    print(f"{'path':8} {'tokens':>7} {'seconds':>8} {'ms/1K tok':>10} {'peak MiB':>9} {'KiB/tok':>8}")
    for tokens in sizes:
        for path in args.paths.split(","):
            row = in_fresh_process(path, tokens, args.sequence, args.threads)
            rows.append(row)
            print(
                f"{path:8} {tokens:>7,} {row['seconds']:>8.2f} {row['ms_per_1k_tokens']:>10.1f} "
                f"{row['peak_mib']:>9.0f} {row['peak_kib_per_token']:>8.1f}",
                flush=True,
            )
    for line in summary(rows):
        print(line)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
