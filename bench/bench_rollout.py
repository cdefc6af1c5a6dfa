"""Rollout throughput of or1's two engines side by side, and the seconds a weight push costs.

Usage: .venv/bin/python bench/bench_rollout.py [--model-dir tiny/model] [--rounds 3] [--threads 1]
Two models, nothing downloaded: the tiny world's model when --model-dir names one (else a fresh 1.7M tiny-shaped
Qwen2 with random weights), and a random-init Qwen2 of ~100M parameters built from a config. For each, both engines
(`hf`: or1's Hugging Face decode loop; `vllm`: vLLM in-process) sample the same prompts with the same settings;
rounds alternate the engines and the median is reported. Generated tokens/s counts response tokens; "push s" is one
`load_weights` of the whole model from (name, tensor) pairs, as the trainer does after every update (the HF engine
copies into its model; vLLM reloads and repacks its kernels, then resets the prefix cache). The last line is the
vLLM / HF ratio of tokens/s on the larger model.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

BIG = {  # ~100M parameters (25M of them the untied output head): head size 64, grouped-query attention
    "hidden_size": 768,
    "num_hidden_layers": 8,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "intermediate_size": 2048,
    "vocab_size": 32000,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
}


def random_qwen2(
    folder: Path, shape: dict, seed: int = 0, *, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> int:
    """Write a random-init Qwen2 model folder with weights in `dtype`, initialised on `device` (a GPU draws a 7B
    model's weights in seconds, a CPU in minutes); returns its parameter count."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        **shape, bos_token_id=0, eos_token_id=1, pad_token_id=1, dtype=str(dtype).removeprefix("torch.")
    )
    with torch.device(device):  # the constructor draws in float32 whatever the config says
        model = Qwen2ForCausalLM(config).to(dtype)
    model.save_pretrained(folder)
    GenerationConfig(eos_token_id=1, pad_token_id=1).save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


class _Ids:
    """The two token ids the HF engine needs from a tokenizer (the random model has no tokenizer)."""

    pad_token_id = eos_token_id = 1


def engines(folder: Path, tiny: bool):
    from or1.engines.hf_rollout import HFRolloutEngine
    from or1.engines.loading import load_causal_lm
    from or1.engines.rollout import EngineSettings
    from or1.engines.vllm_rollout import VLLMRolloutEngine
    from or1.tokens import load_tokenizer

    tokenizer = load_tokenizer(folder) if tiny else _Ids()
    eos = tokenizer.eos_token_id
    hf = HFRolloutEngine(load_causal_lm(folder), tokenizer, micro_batch_size=256)
    vllm = VLLMRolloutEngine(
        folder, [eos], tokenizer.pad_token_id or eos, EngineSettings(dtype="float32", max_model_len=512)
    )
    return {"hf": hf, "vllm": vllm}


def measure(engine, prompts, sampling, weights) -> tuple[float, float]:
    start = time.perf_counter()
    out = engine.generate_ids(prompts, sampling)
    seconds = time.perf_counter() - start
    tokens = sum(len(r) for r in out.responses)
    start = time.perf_counter()
    engine.load_weights(iter(weights))
    return tokens / seconds, time.perf_counter() - start


def bench_model(name: str, folder: Path, tiny: bool, args) -> dict:
    from or1.engines.loading import load_causal_lm
    from or1.engines.rollout import SamplingParams

    model = load_causal_lm(folder)
    weights = [(k, v.detach()) for k, v in model.named_parameters()]
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(2, vocab, (int(n),), generator=gen).tolist() for n in torch.randint(8, 33, (32,))
    ]
    budget = 64 if tiny else 32
    sampling = SamplingParams(n=4, temperature=1.0, max_response_length=budget, seed=0)
    built = engines(folder, tiny)
    for engine in built.values():  # warm-up: the first generate pays one-off costs
        engine.generate_ids(prompts[:4], SamplingParams(n=1, max_response_length=8, seed=0))
    rates: dict[str, list[float]] = {k: [] for k in built}
    pushes: dict[str, list[float]] = {k: [] for k in built}
    for _ in range(args.rounds):
        for kind, engine in built.items():
            rate, push = measure(engine, prompts, sampling, weights)
            rates[kind].append(rate)
            pushes[kind].append(push)
    params = sum(p.numel() for p in model.parameters())
    row = {
        "model": name,
        "parameters": params,
        "work": f"{len(prompts)} prompts x 4 samples x {budget} tokens, T=1.0",
        **{f"{k}_tok_s": statistics.median(v) for k, v in rates.items()},
        **{f"{k}_push_s": statistics.median(v) for k, v in pushes.items()},
    }
    row["ratio"] = row["vllm_tok_s"] / row["hf_tok_s"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=Path("tiny/model"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (vLLM's CPU engine uses the same)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tiny_dir = args.model_dir
        if not (tiny_dir / "config.json").is_file():
            from or1.tinyworld.architecture import TinyModelSpec

            tiny_dir = Path(tmp) / "tiny"
            shape = TinyModelSpec()
            random_qwen2(
                tiny_dir,
                {
                    "hidden_size": shape.hidden_size,
                    "num_hidden_layers": shape.num_hidden_layers,
                    "num_attention_heads": shape.num_attention_heads,
                    "num_key_value_heads": shape.num_key_value_heads,
                    "intermediate_size": shape.intermediate_size,
                    "vocab_size": 300,
                    "max_position_embeddings": 512,
                    "tie_word_embeddings": True,
                },
            )
        rows.append(bench_model("tiny", tiny_dir, tiny_dir == args.model_dir, args))
        big = Path(tmp) / "big"
        random_qwen2(big, BIG)
        rows.append(bench_model("qwen2-100M (random)", big, False, args))
    print(f"load average {os.getloadavg()[0]:.1f}, {args.threads} thread(s), median of {args.rounds} rounds")
    print(
        f"{'model':<20} {'params':>8} {'hf tok/s':>9} {'vllm tok/s':>10} {'hf push s':>9} {'vllm push s':>11}"
    )
    for r in rows:
        print(
            f"{r['model']:<20} {r['parameters'] / 1e6:>7.1f}M {r['hf_tok_s']:>9.0f} {r['vllm_tok_s']:>10.0f} "
            f"{r['hf_push_s']:>9.3f} {r['vllm_push_s']:>11.3f}"
        )
    print(json.dumps(rows))
    print(f"vllm / hf tokens/s on {rows[-1]['model']}: {rows[-1]['ratio']:.2f}x")


if __name__ == "__main__":
    main()
