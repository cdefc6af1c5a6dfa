"""First check of the GPU path on one CUDA GPU: one RL step's phases at real shapes and lengths, nothing downloaded.

Usage: .venv/bin/python bench/gpu_check.py [--shapes 1.5b,0.5b,7b] [--response-lengths 8192,16384]
           [--checkpointing on,off] [--engines hf] [--budget-s S] [--out rows.jsonl] [--peak-tflops 989]
       .venv/bin/python bench/gpu_check.py --dry-run [--engines hf,vllm]     (CPU, tiny shapes and lengths)

Random-init Qwen2 models built from configs in code (the Qwen2-0.5B, 1.5B and 7B shapes; `--dry-run`: tiny ones)
go through what a training step does on one rank, with or1's own code, case by case:
- a step case is (shape, response length, activation checkpointing): sequences of a 512-token prompt and the
  response (random token ids, every token real), two packed end to end into one row per micro-batch, two
  micro-batches an update. The FSDP2 actor (`FSDPPolicyEngine`: float32 master weights, bf16 compute with float32
  reduction, actor.offload, packed rows attended through torch's flash varlen kernel, as the recipes run) computes
  old log-probs and runs PPO updates, each timed after a warm-up: tokens/s and model FLOPs utilisation
  (`or1.compute.flops`, as `or1 train` counts it: forward + backward, causal attention per sequence, the output head
  at the response positions, no recompute; over the GPU's dense bf16 peak from `or1.compute.peak`'s datasheet
  table, or --peak-tflops);
- the 7B shape is a log-prob pass only (a float32 update, 16 bytes a parameter with AdamW's moments, does not fit
  one 80 GB card): it loads as or1 loads the frozen reference policy, `FSDPPolicyEngine(trainable=False)`, but with
  bf16 parameters instead of float32 ones, and no optimizer;
- a generate case, once per trainable shape after its first step cases, in the same process: for each rollout
  engine the hand-off of `WeightSync.rollout_phase` (wake the engine's weights, push the actor's: seconds per GiB,
  offload the actor, wake the KV cache, generate 16 prompts x 4 samples x 256 new tokens: tokens/s, sleep, onload);
- each phase's peak memory (`torch.cuda.max_memory_allocated`; on the CPU the resident set's peak) beside what
  `or1 plan` counts for the same settings, from or1.plan.memory's own terms (`planned_gib`), and measured / plan;
  on the GPU also the allocator's reserved peak (`*_reserved_gib`, what the plan's fragmentation allowance stands
  for) and the memory in use beyond what PyTorch reserved (`outside_gib`: the plan's CUDA context and NCCL terms).
Cases run most informative first: the trainable shapes in the order given with checkpointing, each length in turn,
then without, then the 7B log-prob passes. Each (shape, checkpointing) runs in a process of its own (a vLLM engine
and a process group per process, all memory back after). A case that runs out of CUDA memory is a row with status
"oom" beside its planned peak, and a fresh process takes the group's next case (FSDP's state after a failed pass is
not to be trusted). `--budget-s`: no case starts once that many seconds have passed ("skipped: budget").
`--dry-run` runs the same matrix on the CPU (gloo, float32, no offload) at tiny shapes and lengths: it checks the
path, its numbers mean nothing. Printed: a table, then the rows as a JSON list on the last line; `--out` also gets
the rows as JSON lines, each written as its case ends.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_attention import status_kib  # noqa: E402
from bench_rollout import random_qwen2  # noqa: E402

QWEN2 = {"max_position_embeddings": 32768, "rope_theta": 1000000.0}  # context cut to what the check uses
SHAPES = {  # the published Qwen2 configurations' shapes
    "0.5b": {
        "hidden_size": 896,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "intermediate_size": 4864,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        **QWEN2,
    },
    "1.5b": {
        "hidden_size": 1536,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "intermediate_size": 8960,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        **QWEN2,
    },
    "7b": {
        "hidden_size": 3584,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "intermediate_size": 18944,
        "vocab_size": 152064,
        "tie_word_embeddings": False,
        **QWEN2,
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
    "dry-7b": {  # the 7B's stand-in: untied, log-prob pass only
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "intermediate_size": 256,
        "vocab_size": 512,
        "max_position_embeddings": 256,
        "tie_word_embeddings": False,
    },
}
LOG_PROB_ONLY = {"7b", "dry-7b"}
DRY_SHAPES = ["dry", "dry-7b"]


@dataclass(frozen=True)
class Work:
    """What a case runs: sequences of `prompt` + the case's response tokens, `per_row` of them packed into one row
    (a micro-batch), `rows` micro-batches an update; a generate case samples `samples` responses of `new_tokens`
    to each of `prompts` prompts of `prompt_tokens` random tokens."""

    prompt: int
    per_row: int
    rows: int
    lengths: str  # the default --response-lengths
    prompts: int
    prompt_tokens: int
    samples: int
    new_tokens: int


GPU_WORK = Work(512, 2, 2, "8192,16384", prompts=16, prompt_tokens=32, samples=4, new_tokens=256)
DRY_WORK = Work(8, 2, 2, "16,32", prompts=2, prompt_tokens=4, samples=2, new_tokens=8)
UPDATE_STEPS = 2  # timed updates, after one warm-up
VLLM_UTILIZATION = 0.3  # the check's vLLM share of the GPU
EOS = 1  # random_qwen2's eos id
GIB = 2**30


@dataclass(frozen=True)
class Case:
    """One row of the check. phase: "step" (old log-probs, then updates), "log-probs" (that pass alone) or
    "generate" (the hand-off around each engine's generation, `response` new tokens); checkpointing: the actor's
    activation checkpointing, None where no backward runs."""

    shape: str
    phase: str
    response: int
    checkpointing: bool | None

    def label(self) -> dict:
        return {
            "shape": self.shape,
            "phase": self.phase,
            "response_length": self.response,
            "checkpointing": self.checkpointing,
        }


def matrix(
    shapes: list[str], lengths: list[int], checkpointing: list[bool], generate: bool, work: Work
) -> list[Case]:
    """Every case, most informative first: each trainable shape with the first checkpointing setting (its generate
    case after its step cases, in the same process), then with the next, then the log-prob-only shapes."""
    trained = [s for s in shapes if s not in LOG_PROB_ONLY]
    cases = []
    for i, ckpt in enumerate(checkpointing):
        for shape in trained:
            cases += [Case(shape, "step", n, ckpt) for n in lengths]
            cases += [Case(shape, "generate", work.new_tokens, ckpt)] if i == 0 and generate else []
    return cases + [Case(s, "log-probs", n, None) for s in shapes if s in LOG_PROB_ONLY for n in lengths]


# ---- or1 plan's numbers ----------------------------------------------------------------------------------------
def model_shape(name: str):
    from or1.plan.model import ModelShape

    return ModelShape.from_config({**SHAPES[name], "model_type": "qwen2"}, name)


def planned_gib(case: Case, work: Work, on_gpu: bool) -> dict[str, float | None]:
    """`or1 plan`'s peak of each of a case's phases, composed from or1.plan.memory's terms as or1.plan.stage
    composes them, for this check's settings: one rank, every sequence at full length, `per_row` packed into one row
    with logits at the response positions only, no entropy term; bf16 compute on the GPU, float32 on the CPU (whose
    kernel copies the attention output once more). The CUDA context and NCCL's buffers are left out:
    max_memory_allocated sees neither. A generate case's plan (vLLM's share) needs the GPU's size: its process adds
    it."""
    from or1.plan import memory

    if case.phase == "generate":
        return {}
    model, c, n = model_shape(case.shape), (2 if on_gpu else 4), work.per_row
    window = memory.Window(
        tokens=n * (work.prompt + case.response), logits=n * case.response, scored=n * case.response
    )
    gathered = memory.gathered_bytes(model, c)
    inference = memory.inference_bytes(model, window, compute_bytes=c)
    if case.phase == "log-probs":  # frozen: parameters in the compute dtype, no gradients, no optimizer
        frozen = memory.shard_bytes(model, 1, dtype_bytes=c) + gathered + inference
        return {"log_prob_plan_gib": frozen / GIB, "update_plan_gib": None}
    state = memory.ShardState.of(model, world=1)
    saved = memory.saved_activations(
        model,
        window,
        compute_bytes=c,
        checkpointing=bool(case.checkpointing),
        entropy_grad=False,
        kv_saved_heads=model.kv_heads,
        extra_copy=not on_gpu,
    )
    backward = memory.backward_extra(model, window, compute_bytes=c, entropy_grad=False)
    held = state.parameters + state.optimizer + gathered  # gradients are freed after each optimizer step
    return {
        "log_prob_plan_gib": (held + inference) / GIB,
        "update_plan_gib": (held + state.gradients + saved.total + backward) / GIB,
    }


def planned_rollout_gib(utilization: float, device_bytes: int) -> float:
    """`or1 plan`'s vLLM share during generation: gpu_memory_utilization of the GPU (weights, workspace, KV cache);
    the actor is offloaded."""
    return utilization * device_bytes / GIB


def with_ratios(row: dict) -> dict:
    """The row with measured / planned peak per phase (None where either is missing)."""
    for phase in ("log_prob", "update"):
        measured, planned = row.get(f"{phase}_peak_gib"), row.get(f"{phase}_plan_gib")
        row[f"{phase}_ratio"] = measured / planned if measured is not None and planned else None
    return row


# ---- measuring, in a case's process --------------------------------------------------------------------------
class _Ids:
    """The two token ids the HF engine needs from a tokenizer (the random model has none)."""

    pad_token_id = eos_token_id = EOS


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def peak_memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / GIB
    return status_kib("VmHWM") / 2**20


def reserved_gib(device: torch.device) -> float | None:
    """The caching allocator's reserved peak since the last reset (None on the CPU)."""
    return torch.cuda.max_memory_reserved(device) / GIB if device.type == "cuda" else None


def outside_gib(device: torch.device) -> float | None:
    """GPU memory in use beyond what PyTorch reserved: the CUDA context, NCCL's and the libraries' buffers (and
    any other process on the GPU); None on the CPU."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    return (total - free - torch.cuda.memory_reserved(device)) / GIB


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    else:
        Path("/proc/self/clear_refs").write_text("5")  # the resident set's peak starts again from now


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, run, repeats: int = 1) -> tuple[float, float]:
    """Median seconds of `repeats` calls of `run`, and the peak memory (GiB) over them."""
    reset_peak(device)
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        run()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times), peak_memory_gib(device)


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


def actor_settings(case: Case, work: Work, device: torch.device):
    """The recipes' actor on the GPU (float32 master weights, bf16 compute, offload), or the frozen bf16 policy of
    a log-prob-only shape; float32 and no offload on the CPU."""
    from or1.engines.train_settings import TrainSettings

    on_gpu = device.type == "cuda"
    if case.shape in LOG_PROB_ONLY:
        return TrainSettings(
            dtype="bfloat16" if on_gpu else "float32",
            device=str(device),
            micro_batch_size=work.per_row,
            remove_padding=True,
        )
    return TrainSettings(
        device=str(device),
        mixed_precision="bfloat16" if on_gpu else None,
        offload=on_gpu,
        gradient_checkpointing=bool(case.checkpointing),
        lr=1e-6,
        micro_batch_size=work.per_row,
        remove_padding=True,
    )


def mfu(flops_per_s: float, peak_tflops: float | None) -> float | None:
    return flops_per_s / (peak_tflops * 1e12) if peak_tflops else None


def step_phase(actor, case: Case, work: Work, device: torch.device, peak_tflops: float | None) -> dict:
    """A step's old log-probs and updates at steady state: a warm-up of each first (the update's creates AdamW's
    moments, there in every later step's log-prob pass), then the timed passes, each with its peak memory."""
    from or1.algos.losses import LossConfig
    from or1.compute.flops import forward_flops, training_flops

    sequences = work.per_row * work.rows
    batch = update_batch(SHAPES[case.shape]["vocab_size"], sequences, work.prompt, case.response)
    tokens = int(batch["attention_mask"].sum())
    lengths, logits = [work.prompt + case.response] * sequences, sequences * case.response
    old = actor.log_probs(batch, temperature=1.0)["log_probs"]
    trains = case.phase == "step"
    if trains:
        batch = batch.union(type(batch)({"old_log_probs": old}))
        actor.train_step(batch, LossConfig(), temperature=1.0)
    seconds, peak = timed(device, lambda: actor.log_probs(batch, temperature=1.0))
    row = {
        "tokens": tokens,
        "log_prob_tok_s": tokens / seconds,
        "log_prob_peak_gib": peak,
        "log_prob_reserved_gib": reserved_gib(device),
    }
    model = model_shape(case.shape)
    row["log_prob_mfu"] = mfu(forward_flops(model, lengths, logits).total / seconds, peak_tflops)
    if trains:
        seconds, peak = timed(
            device, lambda: actor.train_step(batch, LossConfig(), temperature=1.0), UPDATE_STEPS
        )
        flops = training_flops(model, lengths, logits) / seconds
        row |= {"update_tok_s": tokens / seconds, "update_peak_gib": peak, "update_tflops": flops / 1e12}
        row |= {"update_reserved_gib": reserved_gib(device), "mfu": mfu(flops, peak_tflops)}
    return row | {"outside_gib": outside_gib(device)}


def generate_phase(actor, settings, folder: Path, case: Case, work: Work, engines: list[str], device) -> dict:
    """Each engine's hand-off around a generation from random prompts (vLLM's plan beside it on the GPU)."""
    from or1.engines.rollout import SamplingParams

    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(
        2, SHAPES[case.shape]["vocab_size"], (work.prompts, work.prompt_tokens), generator=g
    ).tolist()
    sampling = SamplingParams(n=work.samples, temperature=1.0, max_response_length=case.response, seed=0)
    max_model_len = min(512, SHAPES[case.shape]["max_position_embeddings"])  # prompts and new tokens fit
    row: dict = {}
    for kind in engines:
        row |= rollout_phase(kind, folder, actor, settings, prompts, sampling, device, max_model_len)
    if device.type == "cuda" and "vllm" in engines:
        total = torch.cuda.get_device_properties(device).total_memory
        row["vllm_plan_gib"] = planned_rollout_gib(VLLM_UTILIZATION, total)
    return row


def build_engine(kind: str, folder: Path, settings, device: torch.device, max_model_len: int):
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
            max_model_len=max_model_len,
            gpu_memory_utilization=VLLM_UTILIZATION,
            distributed=True,  # as in training: the engine joins the rank's torch.distributed world
        ),
    )


def rollout_phase(
    kind: str, folder: Path, actor, settings, prompts, sampling, device, max_model_len: int
) -> dict:
    """The worker's hand-off order around one engine's generation, each step timed."""
    engine = build_engine(kind, folder, settings, device, max_model_len)
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
    gib = sum(pushed) / GIB
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


def start_rank(on_gpu: bool) -> torch.device:
    """A world of one rank, set up as a worker group sets up each rank (vLLM's external launcher reads it too)."""
    import torch.distributed as dist

    from or1.hybrid.worker import Worker

    if on_gpu and not torch.cuda.is_available():
        raise SystemExit("gpu_check needs a CUDA GPU (or --dry-run on the CPU)")
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
    os.environ["MASTER_PORT"] = str(free_port())
    rank = Worker()
    rank.init_distributed()
    assert (rank.device.type == "cuda") == on_gpu and (dist.get_backend() == "gloo") == (not on_gpu)
    return rank.device


def write_model(folder: Path, name: str, device: torch.device) -> float:
    """The shape's random model folder, unless an earlier process of this run wrote it; seconds spent. The 7B's
    weights are bf16 (its engine loads them so), the others' float32 (the actor's master weights)."""
    if folder.exists():
        return 0.0
    start = time.perf_counter()
    bf16 = name in LOG_PROB_ONLY and device.type == "cuda"
    part = folder.with_name(folder.name + ".part")  # a process killed mid-write leaves no folder to trust
    random_qwen2(part, SHAPES[name], dtype=torch.bfloat16 if bf16 else torch.float32, device=device.type)
    part.rename(folder)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return time.perf_counter() - start


def load_actor(case: Case, work: Work, device: torch.device, folder: Path):
    """The engine a case's process runs on (the actor, or the frozen policy of a log-prob-only shape), its
    settings, and what every row of the process reports: the device, seconds to write and load the model, the
    parameter count, the kernel packed rows go through."""
    from or1.engines import varlen
    from or1.engines.fsdp_actor import FSDPPolicyEngine

    on_gpu = device.type == "cuda"
    common = {"device": torch.cuda.get_device_name(device) if on_gpu else "cpu"}
    common["build_s"] = write_model(folder, case.shape, device)
    settings = actor_settings(case, work, device)
    start = time.perf_counter()
    actor = FSDPPolicyEngine(folder, settings, trainable=case.shape not in LOG_PROB_ONLY)
    common["load_s"] = time.perf_counter() - start
    common["parameters"] = sum(p.numel() for p in actor.model.parameters())
    head_dim = SHAPES[case.shape]["hidden_size"] // SHAPES[case.shape]["num_attention_heads"]
    reason = varlen.flash_unusable(torch.zeros(1, 1, 1, head_dim, device=device, dtype=torch.bfloat16))
    common["packed_attention"] = f"per-segment sdpa ({reason})" if reason else "flash varlen"
    return actor, settings, common


def run_group(cases: list[Case], args: argparse.Namespace) -> None:
    """Cases of one shape and checkpointing setting in this process, each row appended to args.rows as it ends.

    Stops after a case that runs out of CUDA memory (the parent starts a fresh process for the rest); once past
    args.deadline, writes the remaining cases as skipped."""
    import torch.distributed as dist

    from or1.compute.peak import table_tflops

    on_gpu, work = not args.dry_run, DRY_WORK if args.dry_run else GPU_WORK
    device = start_rank(on_gpu)
    folder = Path(args.folder) / cases[0].shape
    actor, settings, common = load_actor(cases[0], work, device, folder)
    peak_tflops = args.peak_tflops or (table_tflops(common["device"]) if on_gpu else None)
    engines = [e for e in args.engines.split(",") if e]
    with open(args.rows, "a") as rows:
        for i, case in enumerate(cases):
            if time.time() >= args.deadline:
                rows.write((json.dumps({"status": "skipped: budget"}) + "\n") * (len(cases) - i))
                break
            try:
                if case.phase == "generate":
                    row = generate_phase(actor, settings, folder, case, work, engines, device)
                else:
                    row = step_phase(actor, case, work, device, peak_tflops)
            except torch.OutOfMemoryError as err:
                oom = {"status": "oom", "peak_at_oom_gib": peak_memory_gib(device), "error": str(err)[:300]}
                rows.write(json.dumps(common | oom) + "\n")
                break
            rows.write(json.dumps(common | row | {"status": "ok"}) + "\n")
            rows.flush()
    dist.destroy_process_group()


# ---- the matrix, one process per (shape, checkpointing) --------------------------------------------------------
def run_process(cases: list[Case], args: argparse.Namespace, folder: Path, deadline: float):
    """`cases` in a process of their own: the rows it wrote (for the first of them) and, when it ended without a
    row for a case it had started, that case's status ("timeout", "failed: ...")."""
    rows_file = folder / f"rows-{time.monotonic_ns()}.jsonl"
    cmd = [
        sys.executable,
        __file__,
        "--group",
        json.dumps([asdict(c) for c in cases]),
        "--folder",
        str(folder),
    ]
    cmd += ["--rows", str(rows_file), "--deadline", repr(deadline), "--engines", args.engines]
    cmd += ["--dry-run"] if args.dry_run else []
    cmd += ["--peak-tflops", str(args.peak_tflops)] if args.peak_tflops else []
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    status = None
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
        if done.returncode:
            sys.stderr.write(done.stdout[-3000:] + done.stderr[-5000:])
            status = f"failed: exit {done.returncode}"
    except subprocess.TimeoutExpired:
        status = "timeout"
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()] if rows_file.exists() else []
    if status is None and len(rows) < len(cases) and (not rows or rows[-1]["status"] != "oom"):
        status = "failed: no row"  # a bug: the process ended well without writing one
    return rows, status


def run_matrix(cases: list[Case], args: argparse.Namespace, folder: Path, out) -> list[dict]:
    """Every case's row with its planned peaks and measured / plan, in order; each group of one shape and
    checkpointing setting in a process, a fresh one after a case it could not finish; `out` gets each row as it
    comes."""
    on_gpu, work = not args.dry_run, DRY_WORK if args.dry_run else GPU_WORK
    deadline = time.time() + args.budget_s if args.budget_s is not None else math.inf
    rows = []
    groups = [list(g) for _, g in itertools.groupby(cases, key=lambda c: (c.shape, c.checkpointing))]
    for i, pending in enumerate(groups):
        shape = pending[0].shape
        while pending:
            if time.time() >= deadline:  # not even a process start for them
                got, status = [{"status": "skipped: budget"}] * len(pending), None
            else:
                got, status = run_process(pending, args, folder, deadline)
            got += [{"status": status}] if status else []
            for case, measured in zip(pending, got, strict=False):
                rows.append(with_ratios(case.label() | planned_gib(case, work, on_gpu) | measured))
                out.write(json.dumps(rows[-1]) + "\n")
                out.flush()
            pending = pending[len(got) :]
        if all(c.shape != shape for later in groups[i + 1 :] for c in later):
            shutil.rmtree(folder / shape, ignore_errors=True)  # the 7B's folder alone is 15 GB of the disk
    return rows


def print_table(rows: list[dict]) -> None:
    def num(v, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    def against_plan(r: dict, phase: str) -> str:
        measured, planned, ratio = (r.get(f"{phase}_{k}") for k in ("peak_gib", "plan_gib", "ratio"))
        return f"{num(measured, '.2f')} / {num(planned, '.2f')} ({num(ratio, '.2f')})"

    described = {r["shape"]: r for r in rows if "parameters" in r}
    for shape, r in described.items():
        print(
            f"{shape}: {r['parameters'] / 1e6:,.1f}M params on {r['device']}, packed attention: "
            f"{r['packed_attention']}"
        )
    print(
        "| shape | phase | response | checkpointing | status | log-probs tok/s | MFU | peak / plan GiB (ratio) "
        "| update tok/s | TFLOP/s | MFU | peak / plan GiB (ratio) |"
    )
    print("|---" * 12 + "|")
    for r in (r for r in rows if r["phase"] != "generate"):
        ckpt = {True: "on", False: "off", None: "-"}[r["checkpointing"]]
        print(
            f"| {r['shape']} | {r['phase']} | {r['response_length']:,} | {ckpt} | {r['status']} "
            f"| {num(r.get('log_prob_tok_s'), ',.0f')} | {num(r.get('log_prob_mfu'), '.1%')} "
            f"| {against_plan(r, 'log_prob')} | {num(r.get('update_tok_s'), ',.0f')} "
            f"| {num(r.get('update_tflops'), '.1f')} | {num(r.get('mfu'), '.1%')} | {against_plan(r, 'update')} |"
        )
    for r in (r for r in rows if r["phase"] == "generate"):
        print(f"{r['shape']} generate, {r['response_length']} new tokens: {r['status']}")
        for kind in ("hf", "vllm"):
            if f"{kind}_rollout_tok_s" in r:
                plan = (
                    f" (or1 plan: vLLM's share {r['vllm_plan_gib']:.2f} GiB)"
                    if kind == "vllm" and "vllm_plan_gib" in r
                    else ""
                )
                print(
                    f"  {kind}: rollout {r[f'{kind}_rollout_tok_s']:,.0f} tok/s, weight push "
                    f"{r[f'{kind}_push_s_per_gib']:.2f} s/GiB ({r[f'{kind}_pushed_gib']:.2f} GiB), actor offload "
                    f"{r[f'{kind}_offload_s']:.2f} s (again {r[f'{kind}_offload_again_s']:.2f} s) / onload "
                    f"{r[f'{kind}_onload_s']:.2f} s, peak {r[f'{kind}_peak_gib']:.2f} GiB{plan}"
                )


def names(text: str, known, what: str, parser: argparse.ArgumentParser) -> list[str]:
    found = [x for x in text.split(",") if x]
    if unknown := set(found) - set(known):
        parser.error(f"unknown {what} {sorted(unknown)}; expected {', '.join(known)}")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="the same matrix on the CPU at tiny shapes")
    parser.add_argument(
        "--shapes", default="1.5b,0.5b,7b", help="comma-separated, in the order to run: 0.5b, 1.5b, 7b"
    )
    parser.add_argument(
        "--response-lengths", help="comma-separated response tokens (default 8192,16384; dry 16,32)"
    )
    parser.add_argument(
        "--checkpointing", default="on,off", help="comma-separated, in the order to run: on, off"
    )
    parser.add_argument(
        "--engines", default="hf", help="comma-separated rollout engines (hf, vllm); '' for none"
    )
    parser.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak, for MFU")
    parser.add_argument("--budget-s", type=float, default=None, help="start no case after this many seconds")
    parser.add_argument("--out", help="also write the rows here, as JSON lines, each as its case ends")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per process")
    for internal in ("--group", "--folder", "--rows"):  # a process of the matrix: these cases, here
        parser.add_argument(internal, help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, default=math.inf, help=argparse.SUPPRESS)
    args = parser.parse_args()
    engines = names(args.engines, ("hf", "vllm"), "engines", parser)
    if args.group:
        run_group([Case(**c) for c in json.loads(args.group)], args)
        return
    work = DRY_WORK if args.dry_run else GPU_WORK
    shapes = DRY_SHAPES if args.dry_run else names(args.shapes, ("0.5b", "1.5b", "7b"), "shapes", parser)
    lengths = [int(n) for n in (args.response_lengths or work.lengths).split(",") if n]
    checkpointing = [c == "on" for c in names(args.checkpointing, ("on", "off"), "checkpointing", parser)]
    cases = matrix(shapes, lengths, checkpointing, bool(engines), work)
    with tempfile.TemporaryDirectory() as tmp, open(args.out or os.devnull, "w") as out:
        rows = run_matrix(cases, args, Path(tmp), out)
    print_table(rows)
    print(json.dumps(rows))
    if failed := [r for r in rows if r["status"].startswith("failed")]:
        raise SystemExit(f"gpu_check: {len(failed)} case(s) failed (their processes' output is above)")


if __name__ == "__main__":
    main()
