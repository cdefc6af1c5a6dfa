"""ray_session's start / join / stop rules, with ray.init and ray.shutdown recorded instead of run."""

import os

import pytest
import ray

from or1.hybrid import cluster
from or1.hybrid.cluster import SOURCE_ROOT, ray_session, worker_runtime_env


@pytest.fixture
def calls(monkeypatch):
    log: list[tuple[str, dict]] = []
    state = {"up": False}

    def init(address=None, **kwargs):
        env = {
            "pythonpath": os.environ.get("PYTHONPATH"),
            **{k: os.environ.get(k) for k in cluster.QUIET_WORKER_ENV},
        }
        log.append(("init", {"address": address, **env, **kwargs}))
        state["up"] = True

    def shutdown():
        log.append(("shutdown", {}))
        state["up"] = False

    monkeypatch.setattr(cluster.ray, "init", init)
    monkeypatch.setattr(cluster.ray, "shutdown", shutdown)
    monkeypatch.setattr(cluster.ray, "is_initialized", lambda: state["up"])
    return log


def test_local_session_starts_quiet_ray_and_stops_it_on_keyboard_interrupt(calls, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/mine")
    with pytest.raises(KeyboardInterrupt):
        with ray_session(None, num_cpus=2):
            raise KeyboardInterrupt
    (kind, options), (last, _) = calls
    assert kind == "init" and last == "shutdown"
    assert options["num_cpus"] == 2 and options["include_dashboard"] is False
    assert options["address"] == "local"  # a private Ray even when another one runs on this machine
    assert (
        options["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    )  # workers inherit it: no loading bars in the console
    # The local raylet (and so every worker) is spawned with the source tree on its path; ours is restored.
    assert options["pythonpath"] == f"{SOURCE_ROOT}{os.pathsep}/mine" and os.environ["PYTHONPATH"] == "/mine"


def test_joining_passes_no_node_options(calls):
    with ray_session("auto", num_cpus=2):
        pass
    (_, options), (last, _) = calls
    # ray.shutdown() in a joined cluster only disconnects this driver.
    assert options["address"] == "auto" and last == "shutdown"
    assert not {"num_cpus", "num_gpus", "include_dashboard"} & set(options)
    assert options["runtime_env"]["env_vars"]["PYTHONPATH"].startswith(str(SOURCE_ROOT))  # remote nodes


def test_an_existing_connection_is_reused_and_left_open(calls):
    ray.init()
    with ray_session(None):
        pass
    assert [kind for kind, _ in calls] == ["init"]


def test_worker_runtime_env_puts_the_source_tree_first_and_keeps_extras():
    env = worker_runtime_env(
        {"env_vars": {"PYTHONPATH": "/extra", "X": "1"}, "config": {"setup_timeout_seconds": 5}}
    )
    assert env["env_vars"]["PYTHONPATH"].split(os.pathsep)[:2] == [str(SOURCE_ROOT), "/extra"]
    assert env["env_vars"]["X"] == "1" and env["config"] == {"setup_timeout_seconds": 5}


def test_a_local_ray_says_at_most_one_line_when_it_starts():
    """Every `or1 train` / `or1 eval` began with Ray's token-authentication notice; a private local Ray (token
    authentication stays on) starts without it, and Ray prints at most one line of its own."""
    import subprocess
    import sys

    code = (
        "import ray\nfrom or1.hybrid.cluster import ray_session\n"
        "with ray_session(None, num_cpus=1):\n    print(ray.get(ray.remote(lambda: 41).remote()) + 1)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SOURCE_ROOT)}
    env.pop("RAY_AUTH_MODE", None)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.stdout.strip() == "42", done.stderr
    assert "Token authentication" not in done.stderr and len(done.stderr.strip().splitlines()) <= 1, (
        done.stderr
    )
