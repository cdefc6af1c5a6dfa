#!/usr/bin/env bash
# Build the or1 sandbox image without any image registry: a debootstrap minbase bookworm root filesystem with
# python3, imported with `podman import`. For machines where only a Debian mirror is reachable. The or1 backend
# passes its runner to the container at start, so the image never needs rebuilding when or1 changes.
# Usage: sandbox/build-image.sh [IMAGE] (default or1-sandbox:latest). Needs root, debootstrap and podman.
# The image is labelled or1.recipe with a hash of the scripts that build it; `build-image.sh --recipe` prints that
# hash, so ci-engine.sh rebuilds an image made by older scripts (one without a package the judge now provides).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
RECIPE="$(cat "$HERE/build-image.sh" "$HERE/link-packages.sh" "$HERE/harden-rootfs.sh" | sha256sum | cut -c1-16)"
if [ "${1:-}" = --recipe ]; then
  echo "$RECIPE"
  exit 0
fi
IMAGE="${1:-or1-sandbox:latest}"
ROOTFS="$(mktemp -d /var/tmp/or1-rootfs.XXXXXX)"
trap 'rm -rf "$ROOTFS"' EXIT

# debootstrap uses its default Debian mirror unless OR1_DEBIAN_MIRROR names another.
debootstrap --variant=minbase --include=python3,python3-sortedcontainers bookworm "$ROOTFS" ${OR1_DEBIAN_MIRROR:+"$OR1_DEBIAN_MIRROR"} >/dev/null
"$HERE/link-packages.sh" "$ROOTFS"
"$HERE/harden-rootfs.sh" "$ROOTFS"
install -D -m 0644 "$HERE/runner.py" "$ROOTFS/opt/or1/runner.py"  # same layout as the Dockerfile

tar -C "$ROOTFS" -c . | podman import \
  --change 'CMD ["/usr/bin/python3", "-I", "-S", "/opt/or1/runner.py", "--init"]' \
  --change 'WORKDIR /tmp' \
  --change "LABEL or1.recipe=$RECIPE" \
  --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8' \
  - "$IMAGE" >/dev/null
echo "built $IMAGE" >&2
