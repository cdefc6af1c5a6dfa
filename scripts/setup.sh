#!/usr/bin/env bash
# Set up or1 on a fresh machine that has python3 and pip (and apt when run as root):
# system packages, a virtual environment at .venv, and or1 installed editable with its dev tools.
# Idempotent: a second run only checks. Override the torch requirement with OR1_TORCH (e.g. a CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  missing=()
  command -v bwrap >/dev/null || missing+=(bubblewrap)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing system packages: ${missing[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
elif ! command -v bwrap >/dev/null; then
  echo "setup: bubblewrap is not installed; the local code sandbox needs it (apt-get install bubblewrap)" >&2
fi

python="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)
# Install torch first and alone, so the CPU build on this machine's disk is taken and no CUDA build is pulled.
"${pip[@]}" install "${OR1_TORCH:-torch==2.13.0}"
"${pip[@]}" install -e ".[dev]"
echo "setup: ready ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'); CLI at .venv/bin/or1)"
