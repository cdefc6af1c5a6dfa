"""Build the GPU kit: the wheels of or1's run-time dependencies that a CUDA machine without a package index lacks,
bubblewrap's .deb when apt can fetch it, and the install.sh that puts them in place there.

Such a machine has torch, transformers and the common scientific stack (numpy, pyarrow, pandas, scipy, matplotlib,
tensorboard, typer, rich, sympy, pyyaml, requests, grpcio, msgpack, protobuf, click, filelock, ...) but no Ray, no
vLLM and no package index, and takes at most 64 MiB of files with the checkout: so the kit carries only what is
missing, and Ray's wheel without its Java jars and the dashboard's source maps (76 MiB -> about 44).

    python scripts/gpu_kit.py [--python 3.12] [--out .gpu-kit]          here, from the project root
    bash .gpu-kit/install.sh [/tmp/or1-kit]; source /tmp/or1-kit/env.sh  there, from the project root

Versions are those installed in the interpreter that runs this script (the project's .venv: what CI tests); a
package it lacks comes at its newest. `main(argv)` is the command, for checks that build a kit themselves.
"""

from __future__ import annotations

import argparse
import csv
import importlib.metadata
import importlib.util
import io
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CARRIED = ROOT / "scripts" / "gpu-kit"  # install.sh and its .deb unpacker, copied into every kit
LIMIT = 64 * 2**20  # what a GPU machine takes of carried files: the checkout and the kit together
MiB = 2**20

# What the CUDA machine lacks of or1's run-time dependencies (pyproject.toml) and of theirs, by who needs them.
MISSING = (
    # worker groups; Ray validates runtime environments with jsonschema, which needs attrs
    "ray",
    "jsonschema",
    "jsonschema-specifications",
    "referencing",
    "rpds-py",
    "attrs",
    # the typed config; pydantic-core wants a newer typing-extensions than torch does, so the kit brings its own
    "pydantic",
    "pydantic-core",
    "annotated-types",
    "typing-inspection",
    "typing-extensions",
    # the math reward
    "math-verify",
    "latex2sympy2-extended",
    "antlr4-python3-runtime",
    # or1 prepare-data: the hub's datasets (`import datasets` needs xxhash) and MinHash near-duplicates
    "datasets",
    "dill",
    "multiprocess",
    "xxhash",
    "datasketch",
    # the docker sandbox backend
    "docker",
    # the prepared check's `pytest -m gpu` (bench/gpu_e2e.py); pyproject's `timeout` is pytest-timeout's
    "pytest",
    "pluggy",
    "iniconfig",
    "pytest-timeout",
    "packaging",  # pytest wants >= 24
)
# Any glibc from 2.17 to 2.28: pip takes a manylinux tag literally, so the older ones are listed too.
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(28, 16, -1)] + [
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
]


def ray_extra(name: str) -> bool:
    """Ray's files or1 never uses: the Java workers' jars and the dashboard's JavaScript source maps."""
    return name.startswith("ray/jars/") or name.endswith(".js.map")


def strip_wheel(wheel: Path, out: Path, drop: Callable[[str], bool]) -> None:
    """Copy `wheel` to `out` without the files `drop` names, and without their lines in its RECORD."""
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if drop(info.filename):
                continue
            content = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                rows = [row for row in csv.reader(io.StringIO(content.decode())) if row and not drop(row[0])]
                text = io.StringIO()
                csv.writer(text, lineterminator="\n").writerows(rows)
                content = text.getvalue().encode()
            # the original ZipInfo keeps each file's mode: Ray's binaries stay executable
            dst.writestr(info, content)


def requirement(name: str) -> tuple[str, bool]:
    """`name==version` as installed here, or the bare name (the newest) where it is not; and which of the two."""
    try:
        return f"{name}=={importlib.metadata.version(name)}", True
    except importlib.metadata.PackageNotFoundError:
        return name, False


def download(spec: str, python: str, dest: Path) -> Path:
    """The wheel of `spec` for CPython `python` on x86_64 Linux, downloaded into `dest` (one clear line if none)."""
    before = set(dest.iterdir())
    platforms = [f"--platform={platform}" for platform in PLATFORMS]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", python, "--implementation", "cp", *platforms, "--dest", str(dest), spec]
    done = subprocess.run(cmd, capture_output=True, text=True)
    new = sorted(set(dest.iterdir()) - before)
    if done.returncode != 0 or len(new) != 1:
        errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")] or ["pip failed"]
        # pip lists every version PyPI has: too long for one line
        why = re.sub(r" \(from versions: .*\)$", "", errors[0])
        raise SystemExit(f"gpu_kit: no wheel of {spec} for CPython {python} on x86_64 Linux: {why}")
    return new[0]


def fetch_bwrap(out: Path) -> Path | None:
    """bubblewrap's .deb from this machine's apt lists (no root needed), or None where apt cannot fetch it."""
    if shutil.which("apt-get") is None:
        return None
    try:
        subprocess.run(["apt-get", "download", "bubblewrap:amd64"], cwd=out, capture_output=True, timeout=120)
    except subprocess.TimeoutExpired:
        return None
    debs = sorted(out.glob("bubblewrap_*.deb"))
    return debs[0] if debs else None


def checkout_bytes(skip: Path) -> int:
    """The size of the files a GPU machine gets of this checkout (tracked and not ignored), leaving out `skip`."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    paths = [ROOT / name.decode() for name in names if name]
    return sum(p.lstat().st_size for p in paths if p.exists() and not p.resolve().is_relative_to(skip))


def fresh_out(out: Path) -> None:
    """Empty `out` for a new kit, refusing a folder that holds something other than a kit."""
    if out.exists() and any(out.iterdir()) and not (out / "kit.json").exists():
        raise SystemExit(f"gpu_kit: {out} is not empty and holds no kit.json: choose another --out")
    shutil.rmtree(out, ignore_errors=True)
    (out / "wheels").mkdir(parents=True)


def build(python: str, out: Path) -> dict:
    """Write the kit for CPython `python` into `out` and return its description (kit.json)."""
    fresh_out(out)
    wheels = []
    with tempfile.TemporaryDirectory() as raw:
        for name in MISSING:
            spec, pinned = requirement(name)
            wheel = download(spec, python, Path(raw))
            kept = out / "wheels" / wheel.name
            if name == "ray":
                strip_wheel(wheel, kept, ray_extra)
            else:
                shutil.move(wheel, kept)
            size = kept.stat().st_size
            version = wheel.name.split("-")[1]
            wheels.append({"name": name, "version": version, "file": kept.name, "bytes": size})
            source = "as in this environment" if pinned else "newest: not installed here"
            print(f"  {name} {version} ({source}): {size / MiB:.1f} MiB", flush=True)
    deb = fetch_bwrap(out)
    print(f"  bubblewrap: {deb.name if deb else 'apt-get could not fetch it: the kit carries no bwrap'}")
    for carried in ("install.sh", "unpack_deb.py"):
        shutil.copy(CARRIED / carried, out / carried)
    total = sum(wheel["bytes"] for wheel in wheels) + (deb.stat().st_size if deb else 0)
    kit = {"python": python, "bytes": total, "wheels": wheels, "bwrap": deb.name if deb else None}
    (out / "kit.json").write_text(json.dumps(kit, indent=1) + "\n")
    return kit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default="3.12", help="the GPU machine's python3 version, e.g. 3.12")
    parser.add_argument("--out", type=Path, default=ROOT / ".gpu-kit", help="the kit's folder (.gpu-kit)")
    args = parser.parse_args(argv)
    match = re.fullmatch(r"3\.(\d+)", args.python)
    if match is None or int(match.group(1)) < 10:
        raise SystemExit(f"gpu_kit: --python {args.python}: give the GPU machine's python3, 3.10 or newer")
    if importlib.util.find_spec("pip") is None:
        raise SystemExit(f"gpu_kit: {sys.executable} has no pip: run it with the project's .venv/bin/python")
    out = args.out.resolve()
    start = time.monotonic()
    print(f"gpu_kit: building a kit for CPython {args.python} in {out}", flush=True)
    build(args.python, out)
    kit = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    checkout = checkout_bytes(skip=out)
    print(
        f"gpu_kit: kit {kit / MiB:.1f} MiB + checkout {checkout / MiB:.1f} MiB = {(kit + checkout) / MiB:.1f} MiB "
        f"of the {LIMIT // MiB} MiB a GPU machine takes, built in {time.monotonic() - start:.0f} s"
    )
    if kit + checkout > LIMIT:
        raise SystemExit(f"gpu_kit: over {LIMIT // MiB} MiB: shrink the checkout or carry fewer packages")
    shown = out.relative_to(ROOT) if out.is_relative_to(ROOT) else out
    print(f"on the GPU machine, from the project root: bash {shown}/install.sh [TARGET]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
