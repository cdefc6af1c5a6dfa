"""One `or1 train` command as a typed request: what the command line asked for, resolved into stage configs once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from or1.config.recipe import load_recipe, resolve, stage_names
from or1.config.schema import RunConfig
from or1.errors import UserError

RESUME_MODES = ("auto", "never")


@dataclass(frozen=True)
class TrainRequest:
    """One `or1 train` command: which stages of which recipe, where, and how earlier results are treated."""

    recipe: str  # a shipped recipe's name or a YAML file
    stage: str = "1"  # a stage number (1-based), a stage name, or "all" (every stage not finished yet)
    run_dir: Path | None = None  # None: runs/<recipe name>
    overrides: tuple[str, ...] = ()  # --set key=value, applied to every stage
    resume: str = "auto"  # auto: continue from the newest complete checkpoint; never: start over
    ray_address: str | None = None  # join this Ray cluster; None: a private local Ray
    overwrite: bool = False  # with resume never: delete the stage's earlier results first
    allow_config_change: bool = False  # resume although the settings differ from the stage's config.yaml
    gpus: str | None = (
        None  # the GPUs the memory check plans for, as `or1 plan --gpus` (None: the visible GPU)
    )
    plan_check: bool = True  # refuse a stage whose planned GPU memory exceeds the GPU's

    def stage_configs(self) -> list[RunConfig]:
        """The config of each stage this request runs, resolved once: that stage, or every stage for `all`."""
        if self.resume not in RESUME_MODES:
            raise UserError(f"--resume {self.resume}: expected {' or '.join(RESUME_MODES)}")
        if self.stage != "all":
            return [resolve(self.recipe, self.stage, list(self.overrides))]
        count = len(stage_names(load_recipe(self.recipe)[1]))
        return [resolve(self.recipe, index, list(self.overrides)) for index in range(1, count + 1)]
