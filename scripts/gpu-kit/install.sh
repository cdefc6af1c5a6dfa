#!/usr/bin/env bash
# Installs an or1 GPU kit (built by scripts/gpu_kit.py) on a CUDA machine without a package index.
#   from the or1 project root:  bash KIT/install.sh [TARGET]      (TARGET: /tmp/or1-kit unless given)
# into the Python that runs or1 there: python3, or $PYTHON when set (the CPU rehearsal uses the project's .venv).
# The kit's wheels go to TARGET, its bubblewrap (when it carries one and the machine has none) to TARGET/bwrap, and
# TARGET/env.sh puts both and the project's src/ on the search paths: `source TARGET/env.sh`, then
# `python3 -m or1.cli doctor`.
set -euo pipefail
kit=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
target=${1:-/tmp/or1-kit}
project=$PWD
python=${PYTHON:-python3}
CHECKED="ray, pydantic, math_verify, datasets, datasketch, docker, or1.cli"
fail() {
  echo "$*" >&2
  exit 1
}

command -v "$python" >/dev/null || fail "no $python on PATH: the kit installs into the python3 that runs or1"
want=$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["python"])' "$kit/kit.json")
have=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$want" = "$have" ] ||
  fail "this kit is for Python $want; $python here is $have: rebuild with scripts/gpu_kit.py --python $have"
[ -d "$project/src/or1" ] || fail "run install.sh from the or1 project root ($project has no src/or1)"
"$python" -m pip --version >/dev/null 2>&1 || fail "$python here has no pip: install python3-pip, then rerun"

mkdir -p "$target"
target=$(cd "$target" && pwd)
# --upgrade replaces what an earlier install put in TARGET; the env variables quiet pip on machines run as root
PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore "$python" -m pip install -q --no-index --no-deps \
  --no-compile --upgrade --target "$target" "$kit"/wheels/*.whl

path="$target/bin"
debs=("$kit"/bubblewrap_*.deb)
if command -v bwrap >/dev/null; then
  echo "bwrap: this machine's $(command -v bwrap)"
elif [ ! -e "${debs[0]}" ]; then
  echo "bwrap: none here and the kit carries none: code rewards cannot run in the local sandbox"
else
  rm -rf "$target/bwrap"
  mkdir -p "$target/bwrap"
  if command -v dpkg-deb >/dev/null; then
    dpkg-deb -x "${debs[0]}" "$target/bwrap"
  else
    "$python" "$kit/unpack_deb.py" "${debs[0]}" "$target/bwrap"
  fi
  # built on another distribution, it may lack a library here: say so rather than leave a bwrap that cannot start
  if why=$("$target/bwrap/usr/bin/bwrap" --version 2>&1); then
    echo "bwrap: the kit's ($why) in $target/bwrap/usr/bin"
    path="$path:$target/bwrap/usr/bin"
  else
    echo "bwrap: the kit's does not run here (${why:0:120}): code rewards need apt-get install bubblewrap"
  fi
fi

{
  echo "# written by $kit/install.sh: or1 from $project with the kit's packages"
  printf 'export PYTHONPATH=%q${PYTHONPATH:+:$PYTHONPATH}\n' "$target:$project/src"
  printf 'export PATH=%q:$PATH\n' "$path"
} >"$target/env.sh"
# a package the machine lacks that the kit does not carry shows here, not in the middle of a run
if ! why=$(PYTHONPATH="$target:$project/src" "$python" -c "import $CHECKED" 2>&1); then
  fail "the kit is in $target, but \`import $CHECKED\` fails here: ${why##*$'\n'}"
fi
echo "or1 GPU kit installed in $target; to use it:"
echo "source $target/env.sh"
