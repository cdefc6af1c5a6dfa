"""The weights push's self-test: a push that leaves the rollout engine on old weights stops the run at that step."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from ray import cloudpickle

from or1.config.recipe import resolve
from or1.errors import UserError
from or1.hybrid.batch import Batch
from or1.hybrid.cluster import ray_session
from or1.hybrid.columns import OLD_LOG_PROBS, SEQUENCE_COLUMNS, UPDATE_COLUMNS
from or1.hybrid.dispatch import Dispatch, register
from or1.hybrid.resource_pool import ResourcePool
from or1.hybrid.sampling import SamplingRequest
from or1.hybrid.worker_group import colocate
from or1.tokens import load_tokenizer
from or1.trainer.prompt_loader import PromptLoader
from or1.workers.actor_rollout_ref import ActorRolloutRefWorker
from or1.workers.weight_sync import FLOAT32_TOLERANCE, HALF_TOLERANCE, check_push, tolerance

RECIPE = str(Path(__file__).resolve().parents[2] / "stages" / "tiny.yaml")


class BrokenPushWorker(ActorRolloutRefWorker):
    """A push that silently does nothing (as a sync skipped under sleep mode): the engine keeps the old weights."""

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self):
        loaded = super().init_model()
        self.weight_sync.push_weights = lambda: None
        return loaded


def test_check_push_passes_within_tolerance_and_names_the_step_beyond_it():
    assert check_push([-1.0, -2.0], [-1.0005, -2.0], 1e-3, "step 3") == pytest.approx(0.00025)
    with pytest.raises(UserError, match=r"^step 7: after the weights push .* 0\.05 over 2 tokens"):
        check_push([-1.0, -2.0], [-1.1, -2.0], 1e-3, "step 7")
    with pytest.raises(UserError):
        check_push([float("nan")], [-1.0], 1e-3, "step 1")
    assert tolerance(None, "float32", "float32") == FLOAT32_TOLERANCE
    assert (
        tolerance(None, "bfloat16", "float32") == HALF_TOLERANCE
        and tolerance(0.5, "float32", "float32") == 0.5
    )


@pytest.mark.parametrize("worker", [ActorRolloutRefWorker, BrokenPushWorker])
def test_a_push_that_left_the_engine_on_old_weights_stops_the_run(worker, tiny_model_dir, tiny_data_dir):
    overrides = [
        f"model.path={tiny_model_dir}",
        f"data.train_files=[{tiny_data_dir / 'train.parquet'}]",
        "trainer.batch_size=4",
        "actor.ppo_mini_batch_size=4",
        "actor.lr=1e-3",  # one step moves the probe's log-probs far past float32's tolerance
        "rollout.n=2",
        "rollout.max_response_length=8",
    ]
    cfg = resolve(RECIPE, 1, overrides)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the Ray workers get this module's subclass
    loader = PromptLoader(
        cfg.data.train_files, load_tokenizer(tiny_model_dir), batch_size=4, max_prompt_length=32, seed=0
    )
    roles = {"actor_rollout": (worker, {"config": cfg, "model_path": str(tiny_model_dir), "threads": 1})}
    with ray_session(None, num_cpus=4):
        actor = colocate(ResourcePool(1, 2, use_gpu=False), roles, name="actor")["actor_rollout"]
        try:
            actor.init_model()
            batch = actor.generate_sequences(loader.next_batch(1), SamplingRequest.training(cfg, 1))
            batch = batch.union(actor.compute_log_prob(batch.only(SEQUENCE_COLUMNS)))
            mask = batch.tensors["response_mask"].float()
            advantages = Batch({"advantages": torch.linspace(-1, 1, len(batch))[:, None] * mask})
            actor.update_actor(batch.union(advantages).only(UPDATE_COLUMNS))
            if worker is BrokenPushWorker:
                with pytest.raises(UserError, match=r"^step 2: after the weights push the rollout engine"):
                    actor.generate_sequences(loader.next_batch(2), SamplingRequest.training(cfg, 2))
            else:
                again = actor.generate_sequences(loader.next_batch(2), SamplingRequest.training(cfg, 2))
                assert OLD_LOG_PROBS in batch and len(again) == 8
        finally:
            actor.shutdown()
