"""First check of the GPU path on one CUDA GPU, in under 8 minutes, nothing downloaded.

Usage: .venv/bin/python bench/gpu_check.py [--shapes 0.5b,1.5b] [--peak-tflops 989]   (one GPU)
       .venv/bin/python bench/gpu_check.py --dry-run                                  (CPU, tiny shape, seconds)

For each shape, a random-init Qwen2 built from a config in code (Qwen2-0.5B and Qwen2-1.5B shapes; `--dry-run`: a
tiny one) goes through what a training step does on one rank, in a process of its own, with or1's own code:
- the FSDP2 actor (`FSDPPolicyEngine`: float32 master weights, bf16 compute with float32 reduction, activation
  checkpointing, actor.offload, sequences packed into one row per micro-batch and attended through torch's flash
  varlen kernel, as the recipes run) computes old log-probs, then PPO updates: update tokens/s and model FLOPs
  utilisation (`or1.compute.flops`, as `or1 train` counts it: forward + backward, causal attention per sequence, the
  output head at the response positions, no recompute; over the GPU's dense bf16 peak from `or1.compute.peak`'s
  datasheet table, or --peak-tflops);
- for each rollout engine (hf, vllm), the hand-off of `WeightSync.rollout_phase`: wake the engine's
  weights, push the actor's weights (seconds per GB of pushed tensors), offload the actor, wake the KV cache,
  generate (response tokens/s), sleep, onload the actor;
- peak GPU memory of each phase (`torch.cuda.max_memory_allocated`; on the CPU the process's peak RSS), printed
  beside what `or1 plan` predicts for the same shape and settings (or1.plan.memory: shards, gathered units, saved
  activations and the backward's transients; vLLM's weights, workspace and KV share), so the first GPU run checks
  the plan (the plan's fixed margin for the CUDA context is left out: max_memory_allocated does not see it).
`--dry-run` runs the same code on the CPU (gloo, float32, no offload) at a tiny shape: it checks the path, its
numbers mean nothing. The last line is a JSON list of one row per shape.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_rollout import random_qwen2  # noqa: E402

SHAPES = {  # the published Qwen2 configurations' shapes (context cut to what the check uses)
    "0.5b": {
        "hidden_size": 896,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "intermediate_size": 4864,
        "vocab_size": 151936,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
        "rope_theta": 1000000.0,
    },
    "1.5b": {
        "hidden_size": 1536,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "intermediate_size": 8960,
        "vocab_size": 151936,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
        "rope_theta": 1000000.0,
    },
    "dry": {  # head size 64: vLLM's CPU attention kernels take 32 * k only from 64 up
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "intermediate_size": 128,
        "vocab_size": 512,
        "max_position_embeddings": 256,
        "tie_word_embeddings": True,
    },
}
# (sequences, prompt tokens, response tokens, micro-batch) of the update; (prompts, samples each, new tokens) of
# the rollout
GPU_WORK = {"update": (32, 512, 1536, 4), "rollout": (64, 4, 256)}
DRY_WORK = {"update": (4, 8, 8, 2), "rollout": (2, 2, 8)}
UPDATE_STEPS = 3  # timed updates, after one warm-up
VLLM_UTILIZATION = 0.3  # the check's vLLM share of the GPU
EOS = 1  # random_qwen2's eos id


class _Ids:
    """The two token ids the HF engine needs from a tokenizer (the random model has none)."""

    pad_token_id = eos_token_id = EOS


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def peak_memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def update_batch(vocab: int, rows: int, prompt: int, response: int):
    """Full-length prompts and responses of random tokens (every token is real: tokens/s counts them all)."""
    from or1.hybrid.batch import Batch
    from or1.workers.rollout_rows import pack_sequences

    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(2, vocab, (rows, prompt), generator=g).tolist()
    responses = torch.randint(2, vocab, (rows, response), generator=g).tolist()
    tensors = pack_sequences(prompts, responses, prompt, response, pad_id=EOS)
    tensors["advantages"] = torch.randn(rows, 1, generator=g).expand(rows, response).contiguous()
    return Batch(tensors)


def planned_update_gib(shape: dict, work: tuple[int, int, int, int], on_gpu: bool) -> float:
    """`or1 plan`'s update peak for this check's actor: one rank, full-length rows packed into one row per
    micro-batch (logits of the response positions only), checkpointing and bf16 compute on the GPU, no entropy
    term."""
    from or1.plan import memory
    from or1.plan.model import ModelShape

    model = ModelShape.from_config({**shape, "model_type": "qwen2"}, "gpu_check")
    _, prompt, response, micro = work
    c = 2 if on_gpu else 4
    window = memory.Window(
        tokens=micro * (prompt + response), logits=micro * response, scored=micro * response
    )
    state = memory.ShardState.of(model, world=1)
    saved = memory.saved_activations(
        model,
        window,
        compute_bytes=c,
        checkpointing=on_gpu,
        entropy_grad=False,
        kv_saved_heads=model.kv_heads,
        extra_copy=not on_gpu,  # the CPU kernel's gather of the attention output back to row order
    )
    total = (
        state.parameters
        + state.gradients
        + state.optimizer
        + memory.gathered_bytes(model, c)
        + saved.total
        + memory.backward_extra(model, window, compute_bytes=c)
    )
    return total / 2**30


def planned_rollout_gib(shape: dict, utilization: float, device_bytes: int) -> float:
    """`or1 plan`'s vLLM share during generation: gpu_memory_utilization of the GPU (weights, workspace, KV cache);
    the actor is offloaded."""
    return utilization * device_bytes / 2**30


def check_shape(name: str, dry_run: bool, peak_tflops: float | None, engines: list[str]) -> dict:
    """One shape in this process: world of one rank, the actor, its updates, then each engine's hand-off."""
    import torch.distributed as dist

    from or1.algos.losses import LossConfig
    from or1.compute.flops import training_flops
    from or1.compute.peak import table_tflops
    from or1.engines import varlen
    from or1.engines.fsdp_actor import FSDPPolicyEngine
    from or1.engines.rollout import SamplingParams
    from or1.engines.train_settings import TrainSettings
    from or1.hybrid.worker import Worker
    from or1.plan.model import ModelShape

    shape = SHAPES[name]
    on_gpu = not dry_run
    if on_gpu and not torch.cuda.is_available():
        raise SystemExit("gpu_check needs a CUDA GPU (or --dry-run on the CPU)")
    device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    work = GPU_WORK if on_gpu else DRY_WORK
    row: dict = {"shape": name, "device": torch.cuda.get_device_name(0) if on_gpu else "cpu"}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / name
        start = time.perf_counter()
        row["parameters"] = random_qwen2(folder, shape)
        row["build_s"] = time.perf_counter() - start
        # a world of one rank, set up as a worker group sets up each rank (vLLM's external launcher reads it too)
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        os.environ["MASTER_PORT"] = str(free_port())
        rank = Worker()
        rank.init_distributed()
        assert rank.device == device and (dist.get_backend() == "gloo") == (not on_gpu)
        rows, prompt, response, micro = work["update"]
        settings = TrainSettings(
            device=str(device),
            mixed_precision="bfloat16" if on_gpu else None,
            offload=on_gpu,
            gradient_checkpointing=on_gpu,
            lr=1e-6,
            micro_batch_size=micro,
            remove_padding=True,
        )
        actor = FSDPPolicyEngine(folder, settings)
        probe = torch.zeros(1, 1, 1, shape["hidden_size"] // shape["num_attention_heads"], device=device)
        reason = varlen.flash_unusable(probe.to(torch.bfloat16))
        row["packed_attention"] = f"per-segment sdpa ({reason})" if reason else "flash varlen"
        batch = update_batch(shape["vocab_size"], rows, prompt, response)
        tokens = int(batch["attention_mask"].sum())
        reset_peak(device)
        start = time.perf_counter()
        old = actor.log_probs(batch, temperature=1.0)["log_probs"]
        sync(device)
        row["log_prob_tok_s"] = tokens / (time.perf_counter() - start)
        batch = batch.union(type(batch)({"old_log_probs": old}))
        loss = LossConfig()
        actor.train_step(batch, loss, temperature=1.0)  # warm-up: allocator, kernels, optimizer state
        times = []
        for _ in range(UPDATE_STEPS):
            sync(device)
            start = time.perf_counter()
            actor.train_step(batch, loss, temperature=1.0)
            sync(device)
            times.append(time.perf_counter() - start)
        seconds = statistics.median(times)
        row["update_tok_s"] = tokens / seconds
        row["update_peak_gib"] = peak_memory_gib(device)
        row["update_plan_gib"] = planned_update_gib(shape, work["update"], on_gpu)
        model = ModelShape.from_config({**shape, "model_type": "qwen2"}, name)
        flops = training_flops(model, [prompt + response] * rows, logits=rows * response) / seconds
        peak = peak_tflops or (table_tflops(row["device"]) if on_gpu else None)
        row["update_tflops"] = flops / 1e12
        row["mfu"] = flops / (peak * 1e12) if peak else None

        prompts_n, samples, new_tokens = work["rollout"]
        g = torch.Generator().manual_seed(1)
        prompts = torch.randint(
            2, shape["vocab_size"], (prompts_n, 32 if on_gpu else 4), generator=g
        ).tolist()
        sampling = SamplingParams(n=samples, temperature=1.0, max_response_length=new_tokens, seed=0)
        for kind in engines:
            row |= rollout_phase(
                kind, folder, actor, settings, prompts, sampling, device, shape["max_position_embeddings"]
            )
        if on_gpu and "vllm" in engines:
            total = torch.cuda.get_device_properties(device).total_memory
            row["vllm_plan_gib"] = planned_rollout_gib(shape, VLLM_UTILIZATION, total)
        dist.destroy_process_group()
    return row


def build_engine(kind: str, folder: Path, settings, device: torch.device, max_positions: int):
    from or1.engines.hf_rollout import HFRolloutEngine
    from or1.engines.loading import load_causal_lm
    from or1.engines.train_settings import DTYPES

    if kind == "hf":
        model = load_causal_lm(folder, dtype=DTYPES[settings.compute_dtype]).to(device)
        return HFRolloutEngine(model, _Ids(), micro_batch_size=256)
    from or1.engines.rollout import EngineSettings
    from or1.engines.vllm_rollout import VLLMRolloutEngine

    return VLLMRolloutEngine(
        folder,
        [EOS],
        EOS,
        EngineSettings(
            dtype=settings.compute_dtype,
            max_model_len=min(512, max_positions),  # the GPU's 32-token prompts and 256 new tokens fit
            gpu_memory_utilization=VLLM_UTILIZATION,
            distributed=True,  # as in training: the engine joins the rank's torch.distributed world
        ),
    )


def rollout_phase(
    kind: str, folder: Path, actor, settings, prompts, sampling, device, max_positions: int
) -> dict:
    """The worker's hand-off order around one engine's generation, each step timed."""
    engine = build_engine(kind, folder, settings, device, max_positions)
    engine.sleep()  # as after ActorRolloutRefWorker.init_model: the actor holds the GPU
    reset_peak(device)
    engine.wake_up(tags=["weights"])
    pushed = []

    def weights():
        for name, tensor in actor.named_full_params():
            pushed.append(tensor.numel() * tensor.element_size())
            yield name, tensor

    sync(device)
    start = time.perf_counter()
    engine.load_weights(weights())
    sync(device)
    push_s = time.perf_counter() - start
    start = time.perf_counter()
    actor.offload()
    offload_s = time.perf_counter() - start
    engine.wake_up(tags=["kv_cache"])
    engine.generate_ids(prompts[:2], type(sampling)(n=1, max_response_length=4, seed=0))  # warm-up
    sync(device)
    start = time.perf_counter()
    out = engine.generate_ids(prompts, sampling)
    sync(device)
    gen_s = time.perf_counter() - start
    engine.sleep()
    start = time.perf_counter()
    actor.onload()
    sync(device)
    onload_s = time.perf_counter() - start
    # again: a run's later steps reuse the pinned host memory the first offload took
    start = time.perf_counter()
    actor.offload()
    again_s = time.perf_counter() - start
    actor.onload()
    gib = sum(pushed) / 2**30
    result = {
        f"{kind}_rollout_tok_s": sum(len(r) for r in out.responses) / gen_s,
        f"{kind}_push_s_per_gib": push_s / gib,
        f"{kind}_pushed_gib": gib,
        f"{kind}_offload_s": offload_s,
        f"{kind}_onload_s": onload_s,
        f"{kind}_offload_again_s": again_s,
        f"{kind}_peak_gib": peak_memory_gib(device),
    }
    del engine
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def print_table(rows: list[dict]) -> None:
    def fmt(v, spec: str) -> str:
        return "n/a" if v is None else format(v, spec)

    for r in rows:
        print(
            f"{r['shape']} ({r['parameters'] / 1e6:.0f}M params, {r['device']}): update {r['update_tok_s']:.0f} tok/s, "
            f"{r['update_tflops']:.1f} TFLOP/s, MFU {fmt(r['mfu'], '.1%')}, peak {r['update_peak_gib']:.2f} GiB "
            f"(or1 plan: {r['update_plan_gib']:.2f} GiB); old log-probs {r['log_prob_tok_s']:.0f} tok/s; packed "
            f"attention: {r['packed_attention']}"
        )
        for kind in ("hf", "vllm"):
            if f"{kind}_rollout_tok_s" in r:
                print(
                    f"  {kind}: rollout {r[f'{kind}_rollout_tok_s']:.0f} tok/s, weight push "
                    f"{r[f'{kind}_push_s_per_gib']:.2f} s/GiB ({r[f'{kind}_pushed_gib']:.2f} GiB), actor offload "
                    f"{r[f'{kind}_offload_s']:.2f} s (again {r[f'{kind}_offload_again_s']:.2f} s) / onload "
                    f"{r[f'{kind}_onload_s']:.2f} s, peak "
                    f"{r[f'{kind}_peak_gib']:.2f} GiB"
                    + (
                        f" (or1 plan: vLLM's share {r['vllm_plan_gib']:.2f} GiB)"
                        if kind == "vllm" and "vllm_plan_gib" in r
                        else ""
                    )
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="the same code on the CPU at a tiny shape")
    parser.add_argument("--shapes", default="0.5b,1.5b", help="comma-separated: 0.5b, 1.5b")
    parser.add_argument("--engines", default="hf,vllm", help="comma-separated rollout engines: hf, vllm")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak, for MFU")
    parser.add_argument("--timeout", type=float, default=210.0, help="seconds per shape")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: check this shape in this process
    args = parser.parse_args()
    engines = [e for e in args.engines.split(",") if e]
    if unknown := set(engines) - {"hf", "vllm"}:
        parser.error(f"unknown engines {sorted(unknown)}; expected hf, vllm")
    if args.one:
        print("ROW " + json.dumps(check_shape(args.one, args.dry_run, args.peak_tflops, engines)))
        return
    shapes = ["dry"] if args.dry_run else [s for s in args.shapes.split(",") if s]
    if unknown := set(shapes) - set(SHAPES):
        parser.error(f"unknown shapes {sorted(unknown)}; expected 0.5b, 1.5b")
    rows = []
    for (
        shape
    ) in shapes:  # one process each: a vLLM engine and a process group per process, all memory back after
        cmd = [sys.executable, __file__, "--one", shape, "--engines", ",".join(engines)]
        cmd += ["--dry-run"] if args.dry_run else []
        cmd += ["--peak-tflops", str(args.peak_tflops)] if args.peak_tflops else []
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
        found = [line[4:] for line in done.stdout.splitlines() if line.startswith("ROW ")]
        if done.returncode or not found:
            sys.stderr.write(done.stdout[-3000:] + done.stderr[-5000:])
            raise SystemExit(f"gpu_check: shape {shape} failed (exit {done.returncode})")
        rows.append(json.loads(found[-1]))
    print_table(rows)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
