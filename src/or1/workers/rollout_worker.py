"""Sampling on a rank: the rollout role that the hybrid worker (colocated) and the rollout replicas (separate) share.

`RolloutRole` builds a rank's rollout engine (the HF loop or vLLM, tensor-parallel groups of consecutive ranks) and
samples what the controller's SamplingRequest asks (`stream_sequences`), tagging every row with the policy version
it was sampled with (`policy_version`: the training step whose weights the engine held, 0 = the stage's start).
Where the weights come from is the subclass's: the hybrid worker pushes its own actor's in `_sampling_phase`; a
`RolloutWorker` (rollout.placement separate) holds whichever version the controller last gave it (`load_weights`),
between requests, never in the middle of one (a Ray actor runs one call at a time).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from or1.config.schema import RunConfig
from or1.engines.loading import load_rollout_engine
from or1.engines.rollout import EngineSettings, RolloutEngine, SamplingParams
from or1.hybrid.batch import Batch
from or1.hybrid.columns import (
    NEW_IDS,
    NEW_LOG_PROBS,
    POLICY_VERSION,
    PROMPT_IDS,
    RESPONSE_SO_FAR,
    RESPONSE_TEXT,
    ROUND_BUDGET,
    ROUND_SEED,
    STOPPED,
)
from or1.hybrid.dispatch import Dispatch, register
from or1.hybrid.sampling import SamplingRequest
from or1.hybrid.worker import Worker
from or1.tokens import load_tokenizer
from or1.workers import weight_transfer as transfer
from or1.workers.rollout_rows import FinishedRows
from or1.workers.weight_sync import check_push

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class RolloutRole:
    """A rank's rollout engine and its sampling calls; the host class is a Worker with `cfg` and `tokenizer`."""

    cfg: RunConfig
    tokenizer: PreTrainedTokenizerBase
    rollout: RolloutEngine
    policy_version: int = 0  # the training step whose weights the engine samples with

    def _build_rollout(self, model_path: str, dtype: str) -> RolloutEngine:
        r = self.cfg.rollout
        tp = r.tensor_parallel_size if r.engine == "vllm" else 1
        world_size = self.world_size
        if world_size % tp:
            raise ValueError(f"rollout.tensor_parallel_size {tp} does not divide the {world_size} ranks")
        # Ranks [g*tp, (g+1)*tp) form tensor-parallel group g: they sample the same prompts together.
        self.tp_size, self.tp_rank, self.tp_index = tp, self.rank % tp, self.rank // tp
        groups = [dist.new_group(list(range(g, g + tp))) for g in range(0, world_size, tp)] if tp > 1 else []
        self.tp_group = groups[self.tp_index] if groups else None
        device = self.device
        if r.engine == "vllm" and device.type == "cuda":
            # vLLM's external launcher takes cuda:<LOCAL_RANK>; Ray shows each rank only its own GPU (cuda:0)
            os.environ["LOCAL_RANK"] = str(device.index)
        settings = EngineSettings(
            dtype=dtype,
            seed=self.cfg.trainer.seed,
            micro_batch_size=r.micro_batch_size,
            max_model_len=self.cfg.data.max_prompt_length + self._longest_response(),
            tensor_parallel_size=tp,
            gpu_memory_utilization=r.gpu_memory_utilization,
            cpu_kv_cache_gib=r.cpu_kv_cache_gib,
            enforce_eager=r.enforce_eager,
            distributed=True,  # every rank builds its vLLM engine in this same call (ONE_TO_ALL)
        )
        return load_rollout_engine(r.engine, model_path, settings, tokenizer=self.tokenizer, device=device)

    def _longest_response(self) -> int:
        """The largest budget this worker samples with: training's, or validation's when larger."""
        validation = getattr(self.cfg.data.validation, "max_response_length", None) or 0
        return max(self.cfg.rollout.max_response_length, validation)

    def _sampling_phase(self, request: SamplingRequest) -> AbstractContextManager[Any]:
        """What surrounds a generation: the engine on the weights to sample with, holding the device."""
        return nullcontext()

    @register(Dispatch.DP_COMPUTE)
    def generate_sequences(self, prompts: Batch, request: SamplingRequest) -> Batch:
        """Sample request.n responses per prompt with the current weights (columns: `rollout_rows`'s and
        `policy_version`)."""
        *_, batch = self.stream_sequences(prompts, request)
        return batch

    @register(Dispatch.DP_COMPUTE)
    def stream_sequences(
        self, prompts: Batch, request: SamplingRequest
    ) -> Iterator[list[dict[str, Any]] | Batch]:
        """`generate_sequences` that first yields the reward inputs of its rows as soon as they are final, in a few
        groups per call (`rollout_rows.FinishedRows`), so the controller scores them while the other rows still
        decode; the last item is the Batch."""
        sampling = self._sampling_params(request)
        prompt_ids = [list(p) for p in prompts[PROMPT_IDS]]
        group_prompts, mine = self._tensor_parallel_share(prompt_ids)
        rows = FinishedRows(prompts, mine, request.n, self.rank, self.tokenizer)
        with self._sampling_phase(request):
            for part in self.rollout.stream_ids(group_prompts, sampling):
                if ready := rows.add(part):
                    yield ready
        if rest := rows.rest():
            yield rest
        pad_id = self.rollout.pad_token_id
        batch = rows.batch(prompt_ids, self.cfg.data.max_prompt_length, request.max_response_length, pad_id)
        yield batch.union(Batch({POLICY_VERSION: torch.full((len(batch),), self.policy_version)}))

    @register(Dispatch.ONE_TO_ALL)
    def pad_token_id(self) -> int:
        """The engine's padding token (what the controller pads a batch it packs itself with)."""
        return self.rollout.pad_token_id

    @register(Dispatch.DP_COMPUTE)
    def continue_responses(
        self, rows: Batch, request: SamplingRequest
    ) -> Iterator[list[dict[str, Any]] | int]:
        """A partial rollout round (`or1.trainer.partial`): each row's response so far continued by at most its
        round budget of tokens, from its own round seed, with the weights the engine holds. Yields each row's
        result as the engine finishes it ({"row": its row in the round's whole batch, and the round section's
        columns of `or1.hybrid.columns`; the response's text once final: stopped or at the budget}), then the
        number of rows."""
        mine = list(
            zip(
                [list(p) + list(r) for p, r in zip(rows[PROMPT_IDS], rows[RESPONSE_SO_FAR], strict=True)],
                rows[ROUND_BUDGET].tolist(),
                rows[ROUND_SEED].tolist(),
                strict=True,
            )
        )
        group, share = self._tensor_parallel_share(mine)
        contexts, budgets, seeds = (list(column) for column in zip(*group, strict=True))
        sampling = SamplingParams(
            temperature=request.temperature,
            top_p=request.top_p,
            max_response_length=max(budgets),
            row_budgets=budgets,
            row_seeds=seeds,
        )
        so_far = rows[RESPONSE_SO_FAR]
        with self._sampling_phase(request):
            for part in self.rollout.stream_ids(contexts, sampling):
                done = []
                for row in part:
                    if not share.start <= row.index < share.stop:
                        continue  # another rank's of the tensor-parallel group
                    local = row.index - share.start
                    response = list(so_far[local]) + row.response
                    final = not row.truncated or len(response) >= request.max_response_length
                    done.append(
                        {
                            "row": self.rank * len(rows) + local,
                            NEW_IDS: row.response,
                            NEW_LOG_PROBS: row.log_probs,
                            STOPPED: not row.truncated,
                            POLICY_VERSION: self.policy_version,
                            RESPONSE_TEXT: self.tokenizer.decode(response, skip_special_tokens=True)
                            if final
                            else None,
                        }
                    )
                if done:
                    yield done
        yield len(rows)

    def _sampling_params(self, request: SamplingRequest) -> SamplingParams:
        """The engine's sampling for `request` on this rank's tensor-parallel group (its seed is the group's)."""
        return SamplingParams(
            n=request.n,
            temperature=request.temperature,
            top_p=request.top_p,
            max_response_length=request.max_response_length,
            stop_token_ids=[],
            seed=request.engine_seed(self.tp_index),
        )

    def _tensor_parallel_share(self, prompt_ids: list[list[int]]) -> tuple[list[list[int]], slice]:
        """All prompts of this rank's tensor-parallel group (its engines serve them together) and this rank's slice.

        With tensor_parallel_size 1 that is just this rank's own prompts.
        """
        if self.tp_group is None:
            return prompt_ids, slice(0, len(prompt_ids))
        shares: list[Any] = [None] * self.tp_size
        dist.all_gather_object(shares, prompt_ids, group=self.tp_group)
        start = sum(len(share) for share in shares[: self.tp_rank])
        return [p for share in shares for p in share], slice(start, start + len(prompt_ids))


class RolloutWorker(RolloutRole, Worker):
    """A rollout replica of the separate placement: one engine (a tensor-parallel group's share of one) on devices
    of its own, sampling with the versioned weights the trainer publishes (`load_weights`)."""

    def __init__(self, config: RunConfig, model_path: str, threads: int | None = None):
        if threads:
            self.set_threads(threads)
        self.cfg, self.model_path = config, model_path
        # the collective route: versions received beside sampling, until the controller asks for them
        self.staged: dict[int, dict[str, torch.Tensor]] = {}
        self.staged_lock = threading.Lock()
        self.init_distributed()

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> dict[str, Any]:
        """Load the tokenizer and the engine on the stage's start weights (policy version 0)."""
        from or1.engines.train_settings import TrainSettings

        dtype = (
            self.cfg.rollout.dtype
            or TrainSettings.from_config(self.cfg, device=str(self.device)).compute_dtype
        )
        self.tokenizer = load_tokenizer(self.model_path)
        self.rollout = self._build_rollout(self.model_path, dtype)
        self.policy_version = 0
        return {"rank": self.rank}

    @register(Dispatch.ONE_TO_ALL)
    def join_weight_group(self, host: str, port: int, world: int, senders: int) -> None:
        """Join the collective route's group after its `senders` training ranks (called aside); what was staged for
        an earlier group is dropped."""
        self.weight_group = transfer.WeightGroup(
            host,
            port,
            senders + self.rank,
            world,
            senders,
            self.cfg.rollout.weight_transfer_backend,
            self.device,
        )
        with self.staged_lock:
            self.staged.clear()

    @register(Dispatch.ONE_TO_ALL)
    def receive_weights(self, version: int, specs: list[transfer.TensorSpec], bucket_bytes: int) -> None:
        """Receive the weights after step `version` from the training ranks and stage them (called aside: the engine
        samples on meanwhile)."""
        weights = self.weight_group.receive(specs, bucket_bytes)
        with self.staged_lock:
            self.staged[version] = weights

    @register(Dispatch.ONE_TO_ALL)
    def load_weights(self, version: int, published: list[Any]) -> int:
        """Swap the engine's weights for the version's: `published` is `ActorRolloutRefWorker.publish_weights`'s
        (the weights' object in Ray's store, or None when they were staged by `receive_weights`, and the push
        probe's ids, the actor's log-probs of them and their tolerance when rollout.weight_sync_check). Then check
        the engine scores the probe like the actor did; the version it now samples with."""
        weights, probe = published
        if weights is None:
            with self.staged_lock:
                weights = self.staged.pop(version)
                self.staged = {v: w for v, w in self.staged.items() if v > version}
        else:
            weights = ray.get(weights)
        self.rollout.wake_up(tags=["weights"])
        self.rollout.load_weights(weights.items())
        self.policy_version = version
        if probe is not None:
            ids, actor, tol = probe
            check_push(self.rollout.score_ids(ids), actor, tol, f"the weights after step {version}")
        return version


@ray.remote(num_cpus=0)
def _save_weights(weights: dict[str, torch.Tensor], path: str) -> None:
    save_file({name: tensor.clone() for name, tensor in weights.items()}, path)


@ray.remote(num_cpus=0)
def _load_weights(path: str) -> dict[str, torch.Tensor]:
    return load_file(path)


def save_published(weights: ray.ObjectRef, path: Path) -> None:
    """Write published weights (`publish_weights`'s object) to a safetensors file, from a Ray task: the
    controller never holds the weights."""
    ray.get(_save_weights.remote(weights, str(path)))


def load_published(path: Path) -> ray.ObjectRef:
    """Weights from a `save_published` file, put in Ray's object store by a Ray task: the object's reference."""
    return _load_weights.remote(str(path))
