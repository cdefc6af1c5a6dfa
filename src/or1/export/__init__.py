"""`or1 export`: a stage's model as a checked Hugging Face folder, from the stage's final weights or a checkpoint.

The folder: safetensors shards in the export's dtype with their index (`model.safetensors.index.json`), config.json
(its dtype the shards'), generation_config.json, the source's tokenizer files (the chat template inside them),
README.md (a model card: recipe, stage, step, the last validation before it) and manifest.json (where it came from:
run, stage, step, the stage config's SHA-256, or1's version and commit; the probe's result; every file's SHA-256).

The check: the source, loaded by or1's training engine on one CPU rank (`FSDPPolicyEngine`, float32), scores the
weights-push probe's tokens (`or1.workers.weight_sync.PROBE_TEXT`); the written folder, loaded back with
transformers in its own dtype, must score them the same: every token within `FLOAT32_TOLERANCE` in float32, the
mean within `HALF_TOLERANCE` in a 16-bit dtype (its rounding alone moves a token's log-prob by ~1e-2); vLLM, where
installed, loads it too and must agree to the weights push's tolerance for its dtype. Then `verify_export` reads the
folder back against its manifest. The folder is written beside its destination (`.NAME.partial`) and renamed into
place only when every check passed: a kill or a failed check leaves nothing at the destination (the source stays
as it was), and a rerun starts the partial folder over.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from or1 import __version__
from or1.errors import UserError
from or1.export.folder import CARD_FILE, DTYPES, copy_tokenizer, set_config_dtype, write_config, write_weights
from or1.export.probe import check_probe, compare
from or1.layout import (
    CHECKPOINT_MODEL_DIR,
    CHECKPOINT_STEP,
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    METRICS_FILE,
    checkpoint_directory,
    finished_model,
    stage_directory,
)
from or1.manifest import MANIFEST_FILE, declared_dtype, sha256, verify_export
from or1.run_metrics import is_training_step, is_validation_accuracy, read_metrics

__all__ = ["Source", "check_stage_final", "export", "find_source", "verify_export"]


@dataclass(frozen=True)
class Source:
    """What an export copies: a model folder of a run's stage, its step, and the stage's folder."""

    run_dir: Path
    stage: int
    step: int
    folder: Path
    stage_dir: Path


def find_source(run_dir: Path, stage: int, step: int | None) -> Source:
    """The stage's final model (step None) or its checkpoint of `step`; a one-line UserError when there is none."""
    stage_dir = stage_directory(run_dir, stage)
    if not stage_dir.is_dir():
        raise UserError(f"{run_dir} has no stage {stage} ({stage_dir} does not exist)")
    if step is None:
        folder = finished_model(run_dir, stage)
        if folder is None:
            raise UserError(
                f"stage {stage} of {run_dir} has no final model yet; export a checkpoint with --step "
                f"(steps: {', '.join(map(str, checkpoint_steps(stage_dir))) or 'none'})"
            )
        trained = [int(r["step"]) for r in read_metrics(stage_dir / METRICS_FILE) if is_training_step(r)]
        return Source(run_dir, stage, max(trained, default=0), folder, stage_dir)
    folder = checkpoint_directory(stage_dir, step) / CHECKPOINT_MODEL_DIR
    if not (folder / "config.json").is_file():
        raise UserError(
            f"stage {stage} of {run_dir} has no complete checkpoint of step {step} "
            f"(steps: {', '.join(map(str, checkpoint_steps(stage_dir))) or 'none'})"
        )
    return Source(run_dir, stage, step, folder, stage_dir)


def checkpoint_steps(stage_dir: Path) -> list[int]:
    folder = stage_dir / CHECKPOINTS_DIR
    found = [CHECKPOINT_STEP.match(p.name) for p in folder.iterdir()] if folder.is_dir() else []
    return sorted(int(m.group(1)) for m in found if m)


def export(
    source: Source,
    out: Path,
    *,
    dtype: str = "float32",
    shard_bytes: int = 5 * 2**30,
    vllm: bool = True,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Write, check and rename into place the export of `source` at `out`; its manifest."""
    if dtype not in DTYPES:
        raise UserError(f"--dtype {dtype}: choose one of {', '.join(DTYPES)}")
    if out.exists() and not overwrite:
        raise UserError(f"{out} exists; choose another --out, or pass --overwrite to replace it")
    partial = partial_folder(out)
    try:
        write_weights(source.folder, partial, dtype, shard_bytes)
        write_config(source.folder, partial, dtype)
        copy_tokenizer(source.folder, partial)
        probe = check_probe(source.folder, partial, dtype, vllm=vllm)
        manifest = seal(source, partial, dtype, probe, origin=str(source.folder.resolve()))
    except BaseException:  # a failed check, Ctrl-C: nothing half-written stays
        shutil.rmtree(partial, ignore_errors=True)
        raise
    put_in_place(partial, out)
    return manifest


def check_stage_final(
    source: Source, partial: Path, ids: list[int], reference: list[float], compute_dtype: str
) -> dict[str, Any]:
    """A stage's final model as the workers wrote it into `partial`, held to the live actor's log-probs of the probe
    (`reference`, computed in `compute_dtype`): loaded with transformers in float32, every token within
    FLOAT32_TOLERANCE of a float32 actor's, the mean within HALF_TOLERANCE of a 16-bit-compute one's (vLLM is not
    loaded here: the rollout engine's own weights-push check covers it during training); then sealed. The manifest,
    or a one-line UserError (the caller keeps the checkpoint)."""
    set_config_dtype(partial)
    dtype = declared_dtype(partial)
    exact = compute_dtype == dtype == "float32"
    probe = compare(partial, ids, reference, dtype, exact=exact, vllm=False)
    return seal(source, partial, dtype, probe, origin=f"the live actor after step {source.step}")


def partial_folder(out: Path) -> Path:
    """The empty folder beside `out` an export is written into (an earlier one, killed before it could clean up,
    is started over)."""
    partial = out.with_name(f".{out.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    return partial


def put_in_place(partial: Path, out: Path) -> None:
    """Rename a checked folder onto `out`, replacing an older one."""
    if out.exists():
        shutil.rmtree(out)
    os.replace(partial, out)


def seal(source: Source, partial: Path, dtype: str, probe: dict[str, Any], origin: str) -> dict[str, Any]:
    """The model card and manifest.json of a checked folder, which is then read back against them; the manifest."""
    (partial / CARD_FILE).write_text(model_card(source, dtype, probe, origin))
    config = source.stage_dir / CONFIG_FILE
    manifest = {
        "run": str(source.run_dir.resolve()),
        "stage": source.stage,
        "step": source.step,
        "source": origin,
        "config_sha256": sha256(config) if config.is_file() else None,
        "or1": {"version": __version__, "commit": or1_commit()},
        "dtype": dtype,
        "probe": probe,
    }
    manifest["files"] = {p.name: sha256(p) for p in sorted(partial.iterdir()) if p.is_file()}
    (partial / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    verify_export(partial)
    return manifest


def model_card(source: Source, dtype: str, probe: dict[str, Any], origin: str) -> str:
    config = source.stage_dir / CONFIG_FILE
    recipe = "-"
    if config.is_file():
        import yaml

        recipe = (yaml.safe_load(config.read_text()) or {}).get("name", "-")
    validation = last_validation(source.stage_dir, source.step)
    lines = [
        f"# {source.run_dir.name}: stage {source.stage}, step {source.step}",
        "",
        f"Trained with or1 {__version__} (recipe `{recipe}`), exported by `or1 export` in {dtype}.",
        "",
        f"- run: `{source.run_dir}`, stage {source.stage}, step {source.step}",
        f"- weights: {origin}",
        f"- probe: transformers' log-probs within {probe['transformers']['max_abs_diff']:.2g} of or1's engine "
        f"(largest, {probe['tokens']} tokens)",
    ]
    if validation:
        lines.append(
            "- validation at or before this step: "
            + ", ".join(f"`{k}` {v:.3f}" for k, v in validation.items())
        )
    return "\n".join(lines) + "\n"


def last_validation(stage_dir: Path, step: int) -> dict[str, float]:
    """The last validation accuracies logged at or before `step`."""
    found: dict[str, float] = {}
    for record in read_metrics(stage_dir / METRICS_FILE):
        if int(record.get("step", -1)) <= step:
            scores = {k: float(v) for k, v in record.items() if is_validation_accuracy(k)}
            found = scores or found
    return found


def or1_commit() -> str | None:
    """The git commit of the or1 source this runs from, when it runs from a checkout (src/or1/export/ in it)."""
    root = Path(__file__).resolve().parents[3]
    if not (root / ".git").exists():
        return None  # an installed copy: its version says what it is
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None
