"""The hybrid worker: actor (FSDP2 training engine), rollout engine and, only when a KL term is on, reference policy.

One instance per data-parallel rank, all three roles in the same process so weights move from training to sampling
in memory: before every generation the rollout engine receives `engine.named_full_params()` through
`load_weights`, the same path the vLLM engine uses on GPU. The controller calls the @register methods through a
WorkerGroup; DP_COMPUTE methods see only this rank's share of the batch.

Columns produced by `generate_sequences` (B = prompts x n, P = max_prompt_length, R = max_response_length):
tensors `input_ids` / `attention_mask` [B, P + R] (prompt left-padded, response right-padded), `responses`,
`response_mask` [B, R], `truncated`, `response_length` [B]; non-tensor `uid` (one per prompt: the GRPO group),
`response_text`, and every non-tensor column of the prompts (repeated n times).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from or1.algos.losses import LossConfig
from or1.config.schema import RunConfig
from or1.engines.fsdp import FSDPTrainEngine, TrainSettings
from or1.engines.hf_rollout import HFRolloutEngine, SamplingParams
from or1.hybrid.batch import Batch
from or1.hybrid.dispatch import Dispatch, register
from or1.hybrid.worker import Worker
from or1.models.loading import load_causal_lm, load_tokenizer

MODEL_DIR = "model"  # inside a checkpoint folder: the HF model (+ optimizer.pt)
TRAIN_COLUMNS = ("input_ids", "attention_mask", "responses", "response_mask")


class ActorRolloutRefWorker(Worker):
    """Actor + rollout (+ reference) of one rank; `init_model` must run before anything else."""

    def __init__(self, config: RunConfig, model_path: str, threads: int | None = None):
        if threads:
            self.set_threads(threads)
        self.cfg = config
        self.model_path = model_path
        self.loss_cfg = LossConfig.from_config(config)
        self.init_distributed()

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> dict[str, Any]:
        """Load tokenizer, FSDP2 actor, the rollout's own plain model copy and (KL only) the reference policy."""
        torch.manual_seed(self.cfg.trainer.seed + self.rank)
        settings = TrainSettings.from_config(self.cfg)
        self.tokenizer = load_tokenizer(self.model_path)
        self.actor = FSDPTrainEngine(self.model_path, settings, device=str(self.device))
        rollout_model = load_causal_lm(self.model_path, dtype=self.actor.model.dtype).to(self.device)
        self.rollout = HFRolloutEngine(
            rollout_model, self.tokenizer, micro_batch_size=self.cfg.rollout.micro_batch_size
        )
        kl = self.cfg.algorithm.kl
        self.ref = (
            FSDPTrainEngine(self.model_path, settings, trainable=False, device=str(self.device))
            if kl.enabled
            else None
        )
        return {"rank": self.rank, "parameters": sum(p.numel() for p in rollout_model.parameters())}

    # ---- rollout ---------------------------------------------------------------------------------------------------
    @register(Dispatch.DP_COMPUTE)
    def generate_sequences(self, prompts: Batch) -> Batch:
        """Sample rollout.n responses per prompt with the current actor weights.

        meta: step and seed (the sampling seed derives from them), and optionally `sampling` overriding n,
        temperature and top_p (validation).
        """
        self.rollout.wake_up()
        self.rollout.load_weights(
            self.actor.named_full_params()
        )  # collective: every rank streams every tensor
        r = self.cfg.rollout
        seed = _mix(
            int(prompts.meta.get("seed", self.cfg.trainer.seed)), int(prompts.meta.get("step", 0)), self.rank
        )
        override = prompts.meta.get("sampling", {})  # validation: its own n / temperature / top_p / budget
        n = int(override.get("n", r.n))
        budget = int(override.get("max_response_length", r.max_response_length))
        sampling = SamplingParams(
            n=n,
            temperature=float(override.get("temperature", r.temperature)),
            top_p=float(override.get("top_p", r.top_p)),
            max_new_tokens=budget,
            stop_token_ids=[],
            seed=seed,
        )
        prompt_ids = [list(p) for p in prompts["prompt_ids"]]
        out = self.rollout.generate_ids(prompt_ids, sampling)
        self.rollout.sleep()
        repeated = prompts.drop(["prompt_ids"]).repeat(n, interleave=True)
        rows = [p for p in prompt_ids for _ in range(n)]
        tensors = pack_sequences(
            rows,
            out.responses,
            self.cfg.data.max_prompt_length,
            budget,
            self.rollout.pad_token_id,
        )
        tensors["truncated"] = torch.tensor(out.truncated, dtype=torch.bool)
        text = self.tokenizer.batch_decode(out.responses, skip_special_tokens=True)
        return repeated.union(Batch(tensors, {"response_text": text}))

    # ---- log-probs -------------------------------------------------------------------------------------------------
    @register(Dispatch.DP_COMPUTE)
    def compute_log_prob(self, batch: Batch) -> Batch:
        """Old log-probs of the sampled responses and their full-vocabulary entropy, [B, R] each."""
        out = self.actor.log_probs(
            batch.only(TRAIN_COLUMNS), temperature=self.cfg.rollout.temperature, with_entropy=True
        )
        return Batch({"old_log_probs": out.tensors["log_probs"], "entropy": out.tensors["entropy"]})

    @register(Dispatch.DP_COMPUTE)
    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        """Reference-policy log-probs [B, R]; only valid when algorithm.kl.enabled loaded a reference model."""
        if self.ref is None:
            raise RuntimeError(
                "compute_ref_log_prob called but algorithm.kl.enabled is false (no reference model)"
            )
        out = self.ref.log_probs(batch.only(TRAIN_COLUMNS), temperature=self.cfg.rollout.temperature)
        return Batch({"ref_log_probs": out.tensors["log_probs"]})

    # ---- update ----------------------------------------------------------------------------------------------------
    @register(Dispatch.DP_COMPUTE)
    def update_actor(self, batch: Batch, entropy_coef: float = 0.0) -> dict[str, float]:
        """One PPO-clip update on this rank's share; returns metrics already averaged over all ranks."""
        columns = [*TRAIN_COLUMNS, "old_log_probs", "advantages"]
        if self.loss_cfg.needs_ref:
            columns.append("ref_log_probs")
        return self.actor.train_step(
            batch.only(columns),
            self.loss_cfg,
            temperature=self.cfg.rollout.temperature,
            entropy_coef=entropy_coef,
        )

    # ---- checkpoints -----------------------------------------------------------------------------------------------
    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        """Rank 0 writes the HF model folder + optimizer under path/model; every rank writes its RNG state."""
        folder = Path(path)
        self.actor.save(folder / MODEL_DIR)
        if self.rank == 0:
            self.tokenizer.save_pretrained(folder / MODEL_DIR, save_jinja_files=False)
        torch.save(rng_state(), folder / f"rng_rank{self.rank}.pt")

    @register(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        """Restore what save_checkpoint wrote (model, optimizer, this rank's RNG when the world size matches)."""
        folder = Path(path)
        self.actor.load(folder / MODEL_DIR)
        rng_file = folder / f"rng_rank{self.rank}.pt"
        if rng_file.is_file():
            set_rng_state(torch.load(rng_file, weights_only=False))

    @register(Dispatch.ONE_TO_ALL)
    def export_model(self, path: str) -> None:
        """Rank 0 writes a plain HF model folder (weights, config, tokenizer) without optimizer state."""
        self.actor.save(Path(path), with_optimizer=False)
        if self.rank == 0:
            self.tokenizer.save_pretrained(Path(path), save_jinja_files=False)


def pack_sequences(
    prompts: list[list[int]], responses: list[list[int]], prompt_width: int, response_width: int, pad_id: int
) -> dict[str, torch.Tensor]:
    """Fixed-width tensors (so ranks' shares concatenate): left-padded prompts, right-padded responses."""
    b = len(prompts)
    ids = torch.full((b, prompt_width + response_width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        p = p[-prompt_width:]  # the loader already dropped longer prompts; this only guards the layout
        ids[i, prompt_width - len(p) : prompt_width] = torch.tensor(p)
        ids[i, prompt_width : prompt_width + len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, prompt_width - len(p) : prompt_width + len(r)] = 1
    response_mask = mask[:, prompt_width:].clone()
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "responses": ids[:, prompt_width:].clone(),
        "response_mask": response_mask,
        "response_length": response_mask.sum(-1),
    }


def rng_state() -> dict[str, Any]:
    """Python, numpy and torch RNG states of this process."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def _mix(seed: int, step: int, rank: int) -> int:
    """A sampling seed that differs per step and rank but is fixed by them (a resumed run samples the same)."""
    return (seed * 1_000_003 + step * 7919 + rank * 104_729) % (2**31 - 1)
