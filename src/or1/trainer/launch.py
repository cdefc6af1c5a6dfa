"""`or1 train` from the command line: pre-flight in a second, then Ray starting while the trainer imports.

This module stays light (no torch): the pre-flight checks answer a bad stage, key, path or cluster address at once,
then Ray starts (its own processes) while a thread imports the trainer (torch, transformers: seconds of CPU), and
one stage, or every remaining stage of `--stage all`, runs in that one Ray.
"""

from __future__ import annotations

import importlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from or1.config.loading import load_recipe, resolve, stage_names
from or1.plan.gate import check_fits
from or1.preflight import check_cpu_inputs, check_train, uses_gpu
from or1.stop import StopFlag


def launch_train(
    recipe: str,
    stage: str,
    run_dir: Path | None,
    overrides: list[str],
    resume: str,
    ray_address: str | None,
    *,
    overwrite: bool,
    allow_config_change: bool,
    gpu_memory: float | None = None,
    plan_check: bool = True,
) -> None:
    """Check, start Ray and train `stage` (a number, a name, or all); run_train repeats the checks, then checks what
    needs torch. With `plan_check`, a stage whose planned GPU memory exceeds the GPU's (`gpu_memory` GiB, else the
    visible GPU's) is refused here, before Ray or any worker starts."""
    cfg = resolve(recipe, "1" if stage == "all" else stage, overrides)
    check_train(cfg, run_dir, ray_address)
    if plan_check and (gpu_memory is not None or uses_gpu(cfg)):
        for name in _stages(recipe, stage):  # each stage this command runs must fit before anything starts
            check_fits(resolve(recipe, name, overrides), gpu_memory)
    check_cpu_inputs(cfg)
    stop = StopFlag()
    with stop.watching():  # from here a Ctrl-C / SIGTERM, even during start-up, stops cleanly
        from or1.hybrid.cluster import local_cpus, ray_session

        with ThreadPoolExecutor(1) as imports:
            trainer = imports.submit(importlib.import_module, "or1.trainer.run")
            widest = max(resolve(recipe, s, overrides).world_size for s in _stages(recipe, stage))
            with ray_session(ray_address, num_cpus=local_cpus(widest)):
                run = trainer.result()
                stop.install()  # ray.init replaced the SIGTERM handler with one that exits mid-call
                options = {"overwrite": overwrite, "allow_config_change": allow_config_change, "stop": stop}
                if stage == "all":
                    run.run_all_stages(recipe, run_dir, overrides, resume, ray_address, **options)
                else:
                    run.run_train(recipe, stage, run_dir, overrides, resume, ray_address, **options)


def _stages(recipe: str, stage: str) -> list[str]:
    """The stages a `train --stage` runs: that one, or every stage of the recipe (1-based numbers) for `all`."""
    if stage != "all":
        return [stage]
    return [str(i) for i in range(1, len(stage_names(load_recipe(recipe)[1])) + 1)]
