"""The hops from `or1 train` to the policy loss: how many or1 functions stand on the call stack between the command
and the PPO-clip loss of one training step, so a layer that only forwards shows up as a number that grows.

The step runs in two processes, as it does in a real run. The controller's chain is traced (`sys.setprofile`) in
this process through one real `or1 train` step of the shipped tiny base on a local Ray: from `or1.cli`'s train
command down to the worker group's fan-out of `update_actor`. The worker's chain is traced in a fresh gloo rank of
world size 1 (the way the engine tests run FSDP in-process), which replays that very call, with the batch the
controller sent: from the rank actor's `call` (what Ray runs in a rank's process) down to the loss. The count is
the two chains' sum.
"""

from __future__ import annotations

import inspect
import json
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import or1
from gloo_ranks import spawn_ranks

RECIPE = str(Path(__file__).resolve().parents[2] / "stages" / "tiny.yaml")
SHIPPED_BASE = Path(or1.__file__).parent / "tinyworld" / "tiny-base"

# 17 before issue 52 (10 controller frames, 7 worker frames); 16 since the worker group's attribute call fans out
# itself instead of forwarding to WorkerGroup._call.
MAX_HOPS = 16


def or1_chain(frame: Any, top: Any) -> list[str]:
    """The or1 functions on the stack from the frame running `top` (a code object) down to `frame`, outermost
    first; functions of other packages (typer, Ray, torch) are not counted."""
    chain = []
    while frame is not None:
        if frame.f_globals.get("__name__", "").split(".")[0] == "or1":
            chain.append(f"{frame.f_globals['__name__']}.{frame.f_code.co_qualname}")
        if frame.f_code is top:
            return chain[::-1]
        frame = frame.f_back
    raise AssertionError(f"{top.co_qualname} is not on the stack: {chain[::-1]}")


def tracing(target: Any, top: Any, found: list, *, caller: bool = False) -> Any:
    """A profile function that records (or1 chain, `target`'s arguments, the chain's last locals) each time
    `target` (a code object) is called; the chain ends at `target`'s frame, or with `caller` at its caller's."""

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is target:
            last = frame.f_back if caller else frame
            found.append((or1_chain(last, top), dict(frame.f_locals), dict(last.f_locals)))

    return profile


def controller_chain(tmp_path: Path) -> tuple[list[str], Any, dict, Any]:
    """One step of `or1 train` in this process: the controller's chain to the update's fan-out, the update's
    arguments, and the step's config."""
    from or1.cli import app
    from or1.config.recipe import resolve
    from or1.data.rows import make_row, write_rows
    from or1.hybrid.worker_group import wait_all

    row = make_row(
        data_source="t",
        prompt=[{"role": "user", "content": "Compute 1+1."}],
        ability="math",
        ground_truth=["2"],
        extra_info={"index": 0},
    )
    data = write_rows(tmp_path / "train.parquet", [row] * 8)
    sets = [
        f"model.path={SHIPPED_BASE}",
        f"data.train_files=[{data}]",
        "data.validation.sets=[]",
        "trainer.steps=1",
        "trainer.devices_per_node=1",
        "trainer.batch_size=4",
        "trainer.loggers=[jsonl]",
        "actor.ppo_mini_batch_size=4",
        "rollout.n=2",
        "rollout.max_response_length=8",
        "algorithm.rejection_sampling=false",  # the step trains whatever the base solves
    ]
    found: list = []
    top = inspect.unwrap(sys.modules["or1.cli.training"].train).__code__
    # the fan-out is the function that sends the call to every rank and waits for them all
    sys.setprofile(tracing(wait_all.__code__, top, found, caller=True))
    try:
        result = CliRunner().invoke(
            app,
            ["train", "--recipe", RECIPE, "--run-dir", str(tmp_path / "run")]
            + [a for s in sets for a in ("--set", s)],
        )
    finally:
        sys.setprofile(None)
    assert result.exit_code == 0, result.output
    updates = [(chain, fan_out) for chain, waits, fan_out in found if waits["method"] == "update_actor"]
    assert len(updates) == 1, [waits["method"] for _, waits, _ in found]
    chain, fan_out = updates[0]  # world size 1: the rank's share is the controller's whole call
    return chain, fan_out["args"], fan_out["kwargs"], resolve(RECIPE, 1, sets)


def _worker_rank(rank: int, cfg: Any, port: int, args: tuple, kwargs: dict, out_file: str) -> None:
    """The controller's update_actor call replayed on a rank actor in this process: its chain to the loss."""
    import torch

    from or1.algos.policy_losses import POLICY_LOSSES
    from or1.hybrid.worker_group import RankActor
    from or1.workers.actor_rollout_ref import ActorRolloutRefWorker

    torch.set_num_threads(1)
    env = {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    roles = {"actor_rollout": (ActorRolloutRefWorker, {"config": cfg, "model_path": cfg.model.path})}
    actor = RankActor()
    actor.setup(env, roles)
    actor.call("actor_rollout", "init_model", (), {})
    found: list = []
    sys.setprofile(tracing(POLICY_LOSSES["ppo"].__code__, RankActor.call.__code__, found))
    try:
        actor.call("actor_rollout", "update_actor", args, kwargs)
    finally:
        sys.setprofile(None)
    Path(out_file).write_text(json.dumps(found[0][0]))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_or1_train_reaches_the_policy_loss_in_few_hops(tmp_path: Path) -> None:
    controller, args, kwargs, cfg = controller_chain(tmp_path)
    assert controller[0] == "or1.cli.training.train"
    assert controller[-1].startswith("or1.hybrid.worker_group.WorkerGroup.")
    out = tmp_path / "worker_chain.json"
    spawn_ranks(_worker_rank, cfg, free_port(), args, kwargs, str(out), nprocs=1)
    worker = json.loads(out.read_text())
    assert worker[0] == "or1.hybrid.worker_group.RankActor.call"
    assert worker[-1] == "or1.algos.policy_losses.ppo_clip_loss"
    chain = "\n  ".join(controller + worker)
    print(f"{len(controller)} + {len(worker)} = {len(controller) + len(worker)} hops:\n  {chain}")
    assert len(controller) + len(worker) <= MAX_HOPS, chain
