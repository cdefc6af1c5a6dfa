#!/usr/bin/env bash
# Build the or1 sandbox image without any image registry: a debootstrap minbase bookworm root filesystem with
# python3, imported with `podman import`. For machines where only a Debian mirror is reachable. The or1 backend
# passes its runner to the container at start, so the image never needs rebuilding when or1 changes.
# Usage: sandbox/build-image.sh [IMAGE] (default or1-sandbox:latest). Needs root, debootstrap and podman.
set -euo pipefail

IMAGE="${1:-or1-sandbox:latest}"
MIRROR="${OR1_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOTFS="$(mktemp -d /var/tmp/or1-rootfs.XXXXXX)"
trap 'rm -rf "$ROOTFS"' EXIT

debootstrap --variant=minbase --include=python3 bookworm "$ROOTFS" "$MIRROR" >/dev/null
"$HERE/harden-rootfs.sh" "$ROOTFS"

tar -C "$ROOTFS" -c . | podman import \
  --change 'CMD ["/usr/bin/sleep", "infinity"]' \
  --change 'WORKDIR /tmp' \
  --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8' \
  - "$IMAGE" >/dev/null
echo "built $IMAGE" >&2
