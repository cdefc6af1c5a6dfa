"""Unpack a Debian package's files into a folder, for the GPU kit's install.sh on machines without dpkg-deb.

A .deb is an ar archive of three members: debian-binary, control.tar.* and data.tar.*; the files are in data.tar.*.
Standard library only: it runs on the GPU machine's python3 before anything is installed.

    python3 unpack_deb.py PACKAGE.deb DEST
"""

from __future__ import annotations

import io
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

AR_MAGIC = b"!<arch>\n"
AR_HEADER = 60  # name 16, mtime 12, uid 6, gid 6, mode 8, size 10, end marker 2


def ar_members(blob: bytes) -> Iterator[tuple[str, bytes]]:
    """The (name, content) of each member of an ar archive."""
    if not blob.startswith(AR_MAGIC):
        raise ValueError("not an ar archive (a .deb starts with !<arch>)")
    pos = len(AR_MAGIC)
    while pos + AR_HEADER <= len(blob):
        header = blob[pos : pos + AR_HEADER]
        name = header[:16].decode("ascii").strip().rstrip("/")  # GNU ar ends names with '/'
        size = int(header[48:58].decode("ascii"))
        start = pos + AR_HEADER
        yield name, blob[start : start + size]
        pos = start + size + size % 2  # each member starts at an even offset


def unpack_deb(deb: Path, dest: Path) -> list[str]:
    """Extract the package's files (its data.tar.*) under `dest`; returns their names."""
    for name, content in ar_members(deb.read_bytes()):
        if not name.startswith("data.tar"):
            continue
        try:
            tar = tarfile.open(fileobj=io.BytesIO(content), mode="r:*")
        except tarfile.ReadError as err:  # data.tar.zst needs Python 3.14's zstd
            raise ValueError(f"{deb.name}: python3 cannot read its {name}: install dpkg-deb ({err})") from err
        with tar:
            # the "data" filter keeps every file under dest (Python 3.12+, and 3.8-3.11 since their 2023 releases)
            extra = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(dest, **extra)
            return tar.getnames()
    raise ValueError(f"{deb.name}: no data.tar member, not a Debian package")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python3 unpack_deb.py PACKAGE.deb DEST")
    try:
        unpack_deb(Path(sys.argv[1]), Path(sys.argv[2]))
    except (OSError, ValueError) as err:
        sys.exit(f"unpack_deb: {err}")
