"""scripts/gpu_kit.py and the kit's install.sh: what a CUDA machine without a package index gets to run or1."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CARRIED = ROOT / "scripts" / "gpu-kit"
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
FAKE_BWRAP = b"#!/bin/sh\necho bubblewrap 0.0-test\n"


def load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpu_kit = load(ROOT / "scripts" / "gpu_kit.py")
unpack_deb = load(CARRIED / "unpack_deb.py")


def ar(members: dict[str, bytes]) -> bytes:
    """An ar archive as a .deb is one: 60-byte headers, GNU names ending in '/', members at even offsets."""
    out = b"!<arch>\n"
    for name, data in members.items():
        header = f"{name + '/':<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n"
        out += header.encode() + data + b"\n" * (len(data) % 2)
    return out


def tar_xz(files: dict[str, tuple[bytes, int]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz") as tar:
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def fake_bwrap_deb(path: Path) -> Path:
    """A bubblewrap .deb whose bwrap only prints its version (an odd-sized member tests the padding)."""
    control = tar_xz({"./control": (b"Package: bubblewrap\n", 0o644)})
    data = tar_xz({"./usr/bin/bwrap": (FAKE_BWRAP, 0o755), "./usr/share/doc/bubblewrap/x": (b"odd", 0o644)})
    path.write_bytes(ar({"debian-binary": b"2.0\n", "control.tar.xz": control, "data.tar.xz": data}))
    return path


def write_wheel(path: Path, files: dict[str, tuple[bytes, int]]) -> Path:
    """A wheel of `files` (name: content, mode) with the metadata pip reads and a RECORD that lists them all."""
    name, version = path.name.split("-")[:2]
    dist_info = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    files = {
        **files,
        f"{dist_info}/METADATA": (metadata.encode(), 0o644),
        f"{dist_info}/WHEEL": (b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n", 0o644),
    }
    with zipfile.ZipFile(path, "w") as whl:
        for member, (data, mode) in files.items():
            info = zipfile.ZipInfo(member)
            info.external_attr = mode << 16
            whl.writestr(info, data)
        record = "".join(f"{member},sha256=x,{len(data)}\n" for member, (data, _) in files.items())
        whl.writestr(f"{dist_info}/RECORD", record + f"{dist_info}/RECORD,,\n")
    return path


def test_ray_wheel_loses_its_jars_and_source_maps_and_their_record_lines(tmp_path: Path):
    files = {
        "ray/__init__.py": (b"", 0o644),
        "ray/core/src/ray/raylet/raylet": (b"\x7fELF", 0o755),
        "ray/jars/ray_dist.jar": (b"java", 0o644),
        "ray/dashboard/client/build/static/js/main.js": (b"js", 0o644),
        "ray/dashboard/client/build/static/js/main.js.map": (b"map", 0o644),
    }
    wheel = write_wheel(tmp_path / "ray-9.0-cp312-cp312-manylinux2014_x86_64.whl", files)
    out = tmp_path / "stripped" / wheel.name
    out.parent.mkdir()
    gpu_kit.strip_wheel(wheel, out, gpu_kit.ray_extra)
    with zipfile.ZipFile(out) as whl:
        names = whl.namelist()
        record = [row[0] for row in csv.reader(io.StringIO(whl.read("ray-9.0.dist-info/RECORD").decode()))]
        raylet_mode = whl.getinfo("ray/core/src/ray/raylet/raylet").external_attr >> 16
    dropped = {"ray/jars/ray_dist.jar", "ray/dashboard/client/build/static/js/main.js.map"}
    dist_info = {f"ray-9.0.dist-info/{name}" for name in ("METADATA", "WHEEL", "RECORD")}
    assert set(names) == set(files) - dropped | dist_info
    assert record == names
    assert raylet_mode == 0o755  # pip keeps the executable bit of Ray's binaries from the wheel


def test_the_deb_unpacker_reads_an_ar_archive_with_a_data_tar(tmp_path: Path):
    deb = fake_bwrap_deb(tmp_path / "bubblewrap_0.0_amd64.deb")
    names = unpack_deb.unpack_deb(deb, tmp_path / "out")
    bwrap = tmp_path / "out" / "usr" / "bin" / "bwrap"
    assert "./usr/bin/bwrap" in names and bwrap.read_bytes() == FAKE_BWRAP and os.access(bwrap, os.X_OK)


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb to build a real .deb")
def test_the_deb_unpacker_reads_what_dpkg_deb_builds(tmp_path: Path):
    tree = tmp_path / "tree"
    (tree / "DEBIAN").mkdir(parents=True)
    (tree / "DEBIAN" / "control").write_text(
        "Package: demo\nVersion: 1.0\nArchitecture: all\nMaintainer: or1 <or1@example.org>\nDescription: demo\n"
    )
    (tree / "usr" / "bin").mkdir(parents=True)
    (tree / "usr" / "bin" / "demo").write_bytes(FAKE_BWRAP)
    (tree / "usr" / "bin" / "demo").chmod(0o755)
    deb = tmp_path / "demo.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", tree, deb], check=True, capture_output=True)
    unpack_deb.unpack_deb(deb, tmp_path / "out")
    assert (tmp_path / "out" / "usr" / "bin" / "demo").read_bytes() == FAKE_BWRAP


def kit_with(tmp_path: Path, python: str, wheels: list[Path] = (), deb: bool = False) -> Path:
    """A kit folder as gpu_kit.build writes one, holding the given wheels (and a fake bubblewrap .deb)."""
    kit = tmp_path / "kit"
    (kit / "wheels").mkdir(parents=True)
    for name in ("install.sh", "unpack_deb.py"):
        shutil.copy(CARRIED / name, kit / name)
    for wheel in wheels:
        shutil.copy(wheel, kit / "wheels")
    if deb:
        fake_bwrap_deb(kit / "bubblewrap_0.0_amd64.deb")
    (kit / "kit.json").write_text(json.dumps({"python": python}))
    return kit


def bare_path(tmp_path: Path) -> str:
    """A PATH with this test's python3 and the few tools install.sh uses, and no bwrap or dpkg-deb."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # a script, not a link: a link to a venv's python outside the venv would not find the venv
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bin_dir / "python3").chmod(0o755)
    for tool in ("dirname", "mkdir", "rm"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    return str(bin_dir)


def install(kit: Path, target: Path, path: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": path} if path else None
    return subprocess.run(
        ["/bin/bash", kit / "install.sh", target], cwd=ROOT, env=env, capture_output=True, text=True
    )


def test_install_refuses_another_python_in_one_line(tmp_path: Path):
    done = install(kit_with(tmp_path, "3.99"), tmp_path / "target")
    assert done.returncode != 0 and not (tmp_path / "target").exists()
    line = r"this kit is for Python 3\.99; python3 here is (3\.\d+): rebuild with scripts/gpu_kit.py --python \1\n"
    assert re.fullmatch(line, done.stderr), done.stderr


def test_install_puts_wheels_and_bwrap_on_the_paths_env_sh_sets(tmp_path: Path):
    wheel = write_wheel(tmp_path / "demo_pkg-1.0-py3-none-any.whl", {"demo_pkg/__init__.py": (b"", 0o644)})
    kit, target = kit_with(tmp_path, PYTHON, [wheel], deb=True), tmp_path / "target"
    path = bare_path(tmp_path)
    done = install(kit, target, path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == f"source {target}/env.sh"
    imported = 'python3 -c "import demo_pkg; print(demo_pkg.__file__)"'
    check = f"source {target}/env.sh && {imported} && bwrap --version"
    used = subprocess.run(["/bin/bash", "-c", check], env={"PATH": path}, capture_output=True, text=True)
    assert used.stdout.splitlines() == [f"{target}/demo_pkg/__init__.py", "bubblewrap 0.0-test"], used.stderr


def test_install_fails_in_one_line_when_or1_cannot_import_its_packages(tmp_path: Path):
    broken = {"ray/__init__.py": (b"raise ImportError('no msgpack here')", 0o644)}
    wheel = write_wheel(tmp_path / "ray-9.0-py3-none-any.whl", broken)
    done = install(kit_with(tmp_path, PYTHON, [wheel]), tmp_path / "target", bare_path(tmp_path))
    assert done.returncode != 0 and done.stderr.count("\n") == 1
    assert "`import ray, pydantic" in done.stderr and done.stderr.endswith("ImportError: no msgpack here\n")


@pytest.mark.slow
def test_a_built_kit_installs_ray_pydantic_math_verify_and_datasets(tmp_path: Path):
    """The real build (downloads about 49 MiB from PyPI): the imports come from the kit's target, not this venv."""
    kit, target = tmp_path / "kit", tmp_path / "target"
    assert gpu_kit.main(["--python", PYTHON, "--out", str(kit)]) == 0
    assert {w["name"] for w in json.loads((kit / "kit.json").read_text())["wheels"]} == set(gpu_kit.MISSING)
    path = str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"]  # python3: this venv's
    assert install(kit, target, path).returncode == 0
    modules = "ray, pydantic, math_verify, datasets, or1.cli"
    show = f"import {modules}; print('\\n'.join(m.__file__ for m in ({modules})))"
    env = {**os.environ, "PYTHONPATH": f"{target}{os.pathsep}{ROOT / 'src'}"}
    files = subprocess.run([sys.executable, "-c", show], env=env, capture_output=True, text=True, check=True)
    *kit_files, or1_file = files.stdout.splitlines()
    assert all(Path(f).is_relative_to(target) for f in kit_files)
    assert Path(or1_file).is_relative_to(ROOT / "src")
