"""Load a recipe YAML, resolve one stage, apply `--set` overrides, and report mistakes as one clear line.

Recipe layout: top-level sections shared by every stage (model, data, rollout, actor, critic, algorithm, reward,
trainer) plus `stages:`, an ordered list whose entries have a `name`, an optional `steps` (trainer.steps), optional
stop rules `until` (trainer.until) and any section overrides.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from or1.config.schema import RunConfig
from or1.errors import UserError

# The config sections a recipe, a stage or `--set` may write: every RunConfig field but the derived recipe / stage.
SECTIONS = tuple(name for name in RunConfig.model_fields if name not in ("recipe", "stage"))
RECIPE_KEYS = {"name", "description", "stages", *SECTIONS}
STAGE_KEYS = {"name", "steps", "until", *SECTIONS}
RECIPES_DIR = Path(__file__).resolve().parents[3] / "stages"


def find_recipe(recipe: str) -> Path:
    """A recipe given as a path, or as a name of a file in the repository's stages/ folder."""
    path = Path(recipe)
    if path.is_file():
        return path
    for candidate in (RECIPES_DIR / recipe, RECIPES_DIR / f"{recipe}.yaml"):
        if candidate.is_file():
            return candidate
    known = ", ".join(sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))) or "none"
    raise UserError(f"recipe not found: {recipe} (give a YAML path or one of: {known})")


def load_recipe(recipe: str) -> tuple[Path, dict[str, Any]]:
    """Read and shape-check a recipe file; returns its path and raw mapping."""
    path = find_recipe(recipe)
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise UserError(f"{path}:{where} is not valid YAML ({getattr(err, 'problem', err)})") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path}: a recipe must be a mapping with sections and a `stages` list")
    for key in raw:
        if key not in RECIPE_KEYS:
            raise UserError(f"{path}: {key}: unknown key (expected one of {', '.join(sorted(RECIPE_KEYS))})")
    stages = raw.get("stages")
    if not isinstance(stages, list) or not stages:
        raise UserError(f"{path}: stages: must be a non-empty list of stages")
    for i, stage in enumerate(stages):
        if not isinstance(stage, dict) or "name" not in stage:
            raise UserError(f"{path}: stages[{i}]: each stage must be a mapping with a name")
        for key in stage:
            if key not in STAGE_KEYS:
                raise UserError(
                    f"{path}: stages[{i}].{key}: unknown key (expected one of {', '.join(sorted(STAGE_KEYS))})"
                )
    return path, raw


def stage_names(raw: dict[str, Any]) -> list[str]:
    return [str(stage["name"]) for stage in raw["stages"]]


def stage_index(raw: dict[str, Any], stage: str | int, path: Path) -> int:
    """1-based index of a stage given by number or by name."""
    names = stage_names(raw)
    text = str(stage)
    if text.isdigit() and 1 <= int(text) <= len(names):
        return int(text)
    if text in names:
        return names.index(text) + 1
    listing = ", ".join(f"{i} ({n})" for i, n in enumerate(names, 1))
    raise UserError(f"{path}: stage {text} is out of range; this recipe has stages {listing}")


def resolve(recipe: str, stage: str | int, overrides: list[str] | None = None) -> RunConfig:
    """The fully resolved, validated config of one stage of a recipe, with `--set key=value` overrides applied."""
    path, raw = load_recipe(recipe)
    index = stage_index(raw, stage, path)
    merged: dict[str, Any] = {key: copy.deepcopy(raw[key]) for key in SECTIONS if key in raw}
    stages = raw["stages"]
    start_step = 0
    for i in range(index):
        spec = stages[i]
        if i < index - 1:
            start_step += int(spec.get("steps") or 0)
            continue
        for key in SECTIONS:
            if key in spec:
                merged[key] = deep_merge(merged.get(key, {}), spec[key], f"{path}: stages[{i}].{key}")
        trainer = merged.setdefault("trainer", {})
        if "steps" in spec:
            trainer["steps"] = spec["steps"]
        if "until" in spec:
            trainer["until"] = deep_merge(
                trainer.get("until", {}), spec["until"], f"{path}: stages[{i}].until"
            )
    set_paths = []
    for item in overrides or []:
        set_paths.append(apply_override(merged, item))
    validation = merged["data"].setdefault("validation", {}) if isinstance(merged.get("data"), dict) else None
    if isinstance(validation, dict) and validation.get("max_response_length") is None:
        validation["max_response_length"] = largest_budget(raw, merged, set_paths)
    merged["recipe"] = raw.get("name", path.stem)
    merged["stage"] = {"index": index, "name": str(stages[index - 1]["name"]), "start_step": start_step}
    try:
        return RunConfig.model_validate(merged)
    except ValidationError as err:
        raise UserError(describe_error(err, path, index - 1, stages[index - 1], set_paths)) from None


def largest_budget(raw: dict[str, Any], merged: dict[str, Any], set_paths: list[tuple[str, ...]]) -> Any:
    """The largest rollout.max_response_length over the recipe's stages (a --set of it applies to every stage)."""
    if any(p[:2] == ("rollout", "max_response_length")[: len(p)] for p in set_paths):
        rollout = merged.get("rollout")
        return rollout.get("max_response_length") if isinstance(rollout, dict) else None
    default = RunConfig.model_fields["rollout"].default_factory().max_response_length
    shared = raw.get("rollout") if isinstance(raw.get("rollout"), dict) else {}
    budgets = []
    for spec in raw["stages"]:
        rollout = spec.get("rollout") if isinstance(spec.get("rollout"), dict) else {}
        budgets.append(rollout.get("max_response_length", shared.get("max_response_length", default)))
    numbers = [b for b in budgets if isinstance(b, int)]
    return max(numbers) if len(numbers) == len(budgets) else None  # a bad value: the schema names it


def deep_merge(base: Any, update: Any, where: str) -> Any:
    """Recursively merge `update` into a copy of `base` (mappings merge, everything else replaces)."""
    if not isinstance(update, dict):
        return copy.deepcopy(update)
    if not isinstance(base, dict):
        raise UserError(f"{where}: expected a value, got a mapping")
    out = copy.deepcopy(base)
    for key, value in update.items():
        out[key] = (
            deep_merge(out.get(key, {}), value, f"{where}.{key}")
            if isinstance(value, dict)
            else copy.deepcopy(value)
        )
    return out


def apply_override(tree: dict[str, Any], item: str) -> tuple[str, ...]:
    """Apply one `a.b.c=value` override in place; the value is parsed as YAML (numbers, lists, booleans)."""
    if "=" not in item:
        raise UserError(f"--set {item}: expected key.path=value")
    key, _, text = item.partition("=")
    parts = tuple(p for p in key.strip().split(".") if p)
    if not parts or parts[0] not in SECTIONS:
        raise UserError(f"--set {item}: the key must start with one of {', '.join(SECTIONS)}")
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        value = text
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise UserError(f"--set {item}: {part} is a value, not a section")
        node = child
    node[parts[-1]] = value
    return parts


def describe_error(
    err: ValidationError,
    path: Path,
    stage_pos: int,
    stage_spec: dict[str, Any],
    set_paths: list[tuple[str, ...]],
) -> str:
    """One line naming where the first problem came from (file and key path, or the --set flag) and what it is."""
    first = err.errors()[0]
    loc = tuple(str(p) for p in first["loc"])
    if not loc:  # a check across sections (RunConfig's validator): its message names the keys
        flags = " with --set " + ", ".join(".".join(p) for p in set_paths) if set_paths else ""
        return f"{path}{flags}: {first['msg'].removeprefix('Value error, ')}"
    dotted = ".".join(loc) or "(top level)"
    if any(loc[: len(p)] == p or p[: len(loc)] == loc for p in set_paths):
        source = f"--set {dotted}"
    elif _has_path(stage_spec, loc) or (loc[:2] == ("trainer", "steps") and "steps" in stage_spec):
        source = f"{path}: stages[{stage_pos}].{dotted}"
    elif loc[:2] == ("trainer", "until") and _has_path(stage_spec, loc[1:]):
        source = f"{path}: stages[{stage_pos}].{'.'.join(loc[1:])}"
    else:
        source = f"{path}: {dotted}"
    kind = first["type"]
    if kind == "extra_forbidden":
        message = "unknown key"
    elif kind == "missing":
        message = "missing required key"
    else:
        message = f"{first['msg'].removeprefix('Value error, ')} (got {first.get('input')!r})"
    return f"{source}: {message}"


def _has_path(tree: Any, loc: tuple[str, ...]) -> bool:
    for part in loc:
        if not isinstance(tree, dict) or part not in tree:
            return False
        tree = tree[part]
    return True


def dump(config: RunConfig) -> str:
    """The resolved config as YAML, in declaration order (what `or1 config show` prints and runs record)."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False, width=110)
