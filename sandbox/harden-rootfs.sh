#!/usr/bin/env bash
# Shared by Dockerfile and build-image.sh: remove from a root filesystem what untrusted programs should not have
# (ctypes, package caches, docs). Usage: harden-rootfs.sh ROOTFS
set -euo pipefail
ROOT="$1"
# ctypes gives a program raw memory access; no judged solution needs it.
rm -f "$ROOT"/usr/lib/python3*/lib-dynload/_ctypes*.so
rm -rf "$ROOT"/var/cache/apt/* "$ROOT"/var/lib/apt/lists/* "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/*
chmod 1777 "$ROOT/tmp"
