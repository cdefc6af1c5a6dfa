"""The export's check: a fixed probe scored by or1's training engine on the source and by transformers and vLLM on
the written folder (`or1.export`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from or1.errors import UserError

FLOAT32_TOLERANCE = 1e-5  # the largest |log-prob difference| of any probe token, both sides float32
HALF_TOLERANCE = 0.1  # the largest mean |difference| with a 16-bit export (the weights push's, `weight_sync`)
VLLM_FLOAT32_TOLERANCE = 1e-3  # vLLM's kernels against torch's, mean |difference| (the weights push's)


def probe_ids(folder: Path) -> list[int]:
    from or1.tokens import load_tokenizer
    from or1.workers.weight_sync import PROBE_TEXT

    return load_tokenizer(folder)(PROBE_TEXT, add_special_tokens=False)["input_ids"]


def engine_log_probs(folder: Path) -> list[float]:
    """The probe's log-probs (every token but the first) from or1's training engine on one CPU rank, float32.

    In a process of its own, ended without the interpreter's teardown: FSDP2 keeps its gloo group's threads past
    `destroy_process_group`, and a teardown beside them can abort (tests/gloo_ranks.py)."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_one_rank_probe, args=(str(folder), send), name="or1-export-probe")
    child.start()
    send.close()
    try:
        ok, result = receive.recv()
    except EOFError:
        child.join()
        ok, result = False, f"its process died (exit code {child.exitcode})"
    finally:  # Ctrl-C here: the child goes too
        if child.is_alive():
            child.terminate()
        child.join()
    if not ok:
        raise UserError(f"or1's engine could not score the probe on {folder}: {result}")
    return result


def _one_rank_probe(folder: str, send: Any) -> None:
    try:
        send.send((True, _engine_probe(folder)))
    except BaseException as err:  # the parent reports it
        send.send((False, f"{type(err).__name__}: {err}"))
    finally:
        send.close()
        os._exit(0)


def _engine_probe(folder: str) -> list[float]:
    import threading

    import torch.distributed as dist
    import tqdm

    # transformers' progress bars would take a multiprocessing lock, which os._exit leaves to the parent's resource
    # tracker to warn about; a thread lock serves this one process
    tqdm.tqdm.set_lock(threading.RLock())

    from or1.engines.fsdp_actor import FSDPPolicyEngine
    from or1.engines.train_settings import TrainSettings
    from or1.tokens import load_tokenizer, pad_id
    from or1.workers.weight_sync import actor_probe

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    engine = FSDPPolicyEngine(folder, TrainSettings(), trainable=False)
    tokenizer = load_tokenizer(folder)
    return actor_probe(engine, tokenizer, pad_id(tokenizer))[1]


def transformers_log_probs(folder: Path, ids: list[int], dtype: str) -> list[float]:
    """The probe's log-probs from the folder loaded with transformers in `dtype`, computed in float32."""
    import torch

    from or1.engines.loading import load_causal_lm

    model = load_causal_lm(folder, dtype=getattr(torch, dtype))
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()


def vllm_log_probs(folder: Path, ids: list[int], dtype: str) -> list[float] | None:
    """The probe's log-probs from vLLM (None where it is not installed)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return None
    import torch

    from or1.engines.loading import load_rollout_engine
    from or1.engines.rollout import EngineSettings
    from or1.tokens import load_tokenizer

    settings = EngineSettings(dtype=dtype, max_model_len=len(ids) + 16)
    tokenizer = load_tokenizer(folder)
    engine = load_rollout_engine("vllm", folder, settings, tokenizer=tokenizer, device=torch.device("cpu"))
    return engine.score_ids(ids)


def gaps(a: list[float], b: list[float]) -> dict[str, float]:
    diffs = [abs(x - y) for x, y in zip(a, b, strict=True)]
    return {"max_abs_diff": max(diffs), "mean_abs_diff": sum(diffs) / len(diffs)}


def check_probe(src: Path, written: Path, dtype: str, *, vllm: bool) -> dict[str, Any]:
    """The probe scored by or1's engine on the source and by transformers (and vLLM) on the written folder; a
    one-line UserError when a side disagrees past its tolerance (the module docstring)."""
    return compare(written, probe_ids(src), engine_log_probs(src), dtype, exact=dtype == "float32", vllm=vllm)


def compare(
    written: Path, ids: list[int], reference: list[float], dtype: str, *, exact: bool, vllm: bool
) -> dict[str, Any]:
    """The written folder (its weights in `dtype`) scored by transformers (and vLLM) against `reference`, or1's own
    log-probs of the probe: every token within FLOAT32_TOLERANCE when `exact` (both sides float32), else the mean
    within HALF_TOLERANCE; the result, or a one-line UserError."""
    result: dict[str, Any] = {"tokens": len(reference)}
    got = gaps(transformers_log_probs(written, ids, dtype), reference)
    tolerance = FLOAT32_TOLERANCE if exact else HALF_TOLERANCE
    result["transformers"] = {**got, "tolerance": tolerance, "of": "max" if exact else "mean"}
    if not (got["max_abs_diff"] if exact else got["mean_abs_diff"]) <= tolerance:  # a NaN fails too
        raise UserError(
            f"{written} loaded with transformers scores a fixed probe unlike or1's engine "
            f"({'largest' if exact else 'mean'} |log-prob difference| "
            f"{got['max_abs_diff' if exact else 'mean_abs_diff']:.3g}, tolerance {tolerance:g}); the export "
            "is not put in place"
        )
    scored = vllm_log_probs(written, ids, dtype) if vllm else None
    if scored is None:
        result["vllm"] = "not installed" if vllm else "skipped"
        return result
    got = gaps(scored, reference)
    tolerance = VLLM_FLOAT32_TOLERANCE if exact else HALF_TOLERANCE
    result["vllm"] = {**got, "tolerance": tolerance, "of": "mean"}
    if not got["mean_abs_diff"] <= tolerance:
        raise UserError(
            f"{written} loaded with vLLM scores a fixed probe unlike or1's engine (mean |log-prob difference| "
            f"{got['mean_abs_diff']:.3g}, tolerance {tolerance:g}); the export is not put in place"
        )
    return result
