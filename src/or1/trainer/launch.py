"""`or1 train` in one pass: one request, each stage resolved once, the checks, Ray and the stop flag set up once.

This module stays light (no torch): the pre-flight checks answer a bad stage, key, path, cluster address or data a
step cannot be drawn from at once, then Ray starts (its own processes) while a thread imports the stage runner
(torch, transformers: seconds of CPU), and the requested stages run in that one Ray, each from its resolved config
(`or1.trainer.run.run_stages`).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

from rich.console import Console

from or1.data.prompts import check_prompts
from or1.layout import run_directory
from or1.plan.gate import check_fits
from or1.preflight import check_cpu_inputs, check_data_files, check_device, check_train, uses_gpu
from or1.stop import StopFlag
from or1.trainer.request import TrainRequest


def launch(request: TrainRequest, console: Console | None = None) -> Path:
    """Check, start Ray and train the requested stages; the last stage's final model folder.

    Ctrl-C / SIGTERM (watched from here on, also during start-up) stop between steps after a checkpoint:
    `or1.stop.Interrupted` is raised.
    """
    console = console or Console(soft_wrap=True)  # paths and counts stay on one line, also in logs
    stages = request.stage_configs()
    run_dir = run_directory(stages[0].recipe, request.run_dir)
    check_train(stages[0], request.run_dir, request.ray_address)
    if request.plan_check:
        for cfg in stages:  # each stage this command runs must fit before anything starts
            if request.gpus is not None or uses_gpu(cfg):
                if (line := check_fits(cfg, request.gpus, run_dir)) is not None:
                    console.print(line, style="yellow", markup=False)
    first = stages[0]
    model = check_cpu_inputs(first)  # a CPU recipe's stage 1 model: its tokenizer counts the prompts below
    check_device(first, request.ray_address)
    check_data_files(first)
    check_prompts(first.data.train_files, first.trainer.batch_size, first.data.max_prompt_length, model)
    stop = StopFlag()
    with stop.watching():
        from or1.hybrid.cluster import local_cpus, ray_session

        with ThreadPoolExecutor(1) as imports:
            runner = imports.submit(_import_stage_runner)
            widest = max(cfg.step_devices for cfg in stages)  # the ranks and, separate, the replicas
            with ray_session(request.ray_address, num_cpus=local_cpus(widest)):
                stop.install()  # ray.init replaced the SIGTERM handler with one that exits mid-call
                return runner.result().run_stages(request, stages, run_dir, console, stop)


def _import_stage_runner() -> ModuleType:
    from or1.trainer import run

    return run
