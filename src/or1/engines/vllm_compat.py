"""Everything or1 knows about vLLM's internals, in one place: import, version range, engine start, weight reload.

When a vLLM release changes one of these, this is the only file to touch. Facts it relies on (vllm 0.32):
- The in-process engine (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) starts in seconds and lets or1 call into the worker
  directly; inside a torch.distributed world (the training ranks) the `external_launcher` executor reuses that
  world, so every rank must build its engine at the same time.
- `model.load_weights` fails on the CPU backend (linear weights are repacked for oneDNN); the worker's
  `reload_weights(weights_iterator=...)` works on CPU and GPU alike and processes each layer as its tensors arrive.
  Prefix-cached KV from the old weights must be dropped after every reload.
- On CPU a tied LM head keeps its own packed copy of the embedding, which `reload_weights` does not refresh (nothing
  is loaded under its name): or1 repacks it after every reload.
- The CPU engine reads its KV-cache size from `VLLM_CPU_KVCACHE_SPACE` (GiB) and replaces `torch.set_num_threads`
  with a stub; or1 restores the real function so its trainer can still size thread pools.
- Sleep mode (freeing GPU memory between rollouts) exists only on CUDA.
- `llm_engine.add_request(request_id, prompt, params)` queues a request under the caller's id (outputs carry that
  id; the engine's own id adds a random suffix), and `llm_engine.step()` returns each request's output with
  `finished` set once it is final (what `LLM.generate` loops over internally), so finished requests can be handed
  on while the others still decode.
- Tensor parallelism on CPU runs vLLM's multiprocess executor (workers spawned: the main module needs a
  `__main__` guard) and binds each rank's OpenMP threads to the cores `VLLM_CPU_OMP_THREADS_BIND` lists ("0|1");
  its automatic binding wants one NUMA node per rank, so or1 lists this process's cores split among the ranks.
  Its ranks' all-reduce buffers (/dev/shm/vllm_dist_*-cpushm_<rank>, 4 MiB each) were left behind by one of two
  test runs that ended the process with the engine still up.
  vLLM caches its environment settings once an engine has started (`envs.enable_envs_cache`): a later engine in
  the same process sees new ones only after `envs.disable_envs_cache()`.
- Seeded requests on CPU fail when a prompt's prefill is split across scheduler steps (chunked prefill rewinds the
  request's generator, which CPU generators cannot do): on CPU whole prompts are scheduled.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from or1.engines.rollout import EngineSettings
from or1.errors import UserError
from or1.preflight import INSTALL_HINT, installed_build, version_problem


def import_vllm() -> Any:
    """Import vllm for an in-process engine, or raise a one-line UserError saying how to install it."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # read when the first engine starts
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # its per-step INFO lines would drown or1's
    build = installed_build()
    if build is None:
        raise UserError(f"rollout engine vllm needs vLLM, which is not installed: {INSTALL_HINT}")
    problem = version_problem(build[1])
    if problem:
        raise UserError(problem)
    try:
        import vllm
    except ImportError as err:  # e.g. a CUDA torchvision beside the CPU torch
        raise UserError(f"vLLM {build[1]} is installed but does not import ({err}); {INSTALL_HINT}") from None
    return vllm


def start_engine(model_path: str, settings: EngineSettings) -> Any:
    """A `vllm.LLM` that takes token ids and returns processed log-probs; `distributed`: join the torch world."""
    vllm = import_vllm()
    on_gpu = torch.cuda.is_available()
    kwargs: dict[str, Any] = {
        "model": str(model_path),
        "skip_tokenizer_init": True,  # or1 tokenizes and detokenizes with the model's own tokenizer
        "dtype": settings.dtype_on(on_gpu),
        "seed": settings.seed,
        "max_model_len": settings.max_model_len,
        "enable_prefix_caching": True,  # the n samples of a prompt share its KV
        "logprobs_mode": "processed_logprobs",  # temperature / top_p applied, as the actor recomputes them
        "tensor_parallel_size": settings.tensor_parallel_size,
        "enforce_eager": settings.enforce_eager or not on_gpu,  # CPU: no graph capture to amortise
    }
    if settings.distributed:
        kwargs["distributed_executor_backend"] = "external_launcher"
    if on_gpu:
        kwargs.update(gpu_memory_utilization=settings.gpu_memory_utilization, enable_sleep_mode=True)
    else:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, math.ceil(settings.cpu_kv_cache_gib)))
        # A prompt split across scheduler steps makes vLLM rewind the request's seeded generator, which CPU
        # generators cannot do ("CPU Generator does not use offset"): schedule whole prompts only.
        kwargs["enable_chunked_prefill"] = False
        if settings.tensor_parallel_size > 1 and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cpu_thread_binding(settings.tensor_parallel_size)
        # an engine started earlier in this process froze vLLM's view of the environment: read it again
        getattr(vllm.envs, "disable_envs_cache", lambda: None)()
    set_num_threads = torch.set_num_threads
    try:
        return vllm.LLM(**kwargs)
    finally:
        torch.set_num_threads = set_num_threads


def cpu_thread_binding(ranks: int) -> str:
    """This process's cores split among `ranks` tensor-parallel ranks, as VLLM_CPU_OMP_THREADS_BIND reads them."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    size = max(1, len(cores) // ranks)
    groups = [cores[i * size : (i + 1) * size] or cores[-1:] for i in range(ranks)]
    return "|".join(",".join(map(str, group)) for group in groups)


def max_model_len(llm: Any) -> int:
    """The engine's context length in tokens (prompt + response)."""
    return int(llm.llm_engine.vllm_config.model_config.max_model_len)


def sleep_supported(llm: Any) -> bool:
    return bool(llm.llm_engine.vllm_config.model_config.enable_sleep_mode)


def reload_weights(llm: Any, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Load (HF name, full tensor) pairs into the engine's model in place, then drop KV cached under the old ones."""
    llm.collective_rpc(_reload_in_worker, args=(weights,))
    llm.reset_prefix_cache()


def _reload_in_worker(worker: Any, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    worker.reload_weights(weights_iterator=weights)
    model = worker.model_runner.get_model()
    head = getattr(model, "lm_head", None)
    if (
        not torch.cuda.is_available()
        and getattr(model.config, "tie_word_embeddings", False)
        and head is not None
    ):
        head.quant_method.process_weights_after_loading(head)  # repack the tied head from the new embedding


def tokens_prompt(ids: list[int]) -> Any:
    from vllm.inputs import TokensPrompt

    return TokensPrompt(prompt_token_ids=ids)


_CALLS = itertools.count()  # request ids stay unique across calls of one process


def stream_finished(llm: Any, prompts: list[Any], params: list[Any]) -> Iterator[list[tuple[int, Any]]]:
    """(position in `prompts`, RequestOutput) of the requests each engine step finished, until all have."""
    engine = llm.llm_engine
    call = next(_CALLS)
    for i, (prompt, param) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(f"or1-{call}-{i}", prompt, param)
    try:
        while engine.has_unfinished_requests():
            done = [(int(out.request_id.rsplit("-", 1)[1]), out) for out in engine.step() if out.finished]
            if done:
                yield done
    finally:  # a consumer that stops early leaves no request behind in the engine
        if engine.has_unfinished_requests():
            engine.abort_request([f"or1-{call}-{i}" for i in range(len(prompts))])
