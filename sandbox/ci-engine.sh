#!/usr/bin/env bash
# Bring up what the sandbox tests need on a fresh Debian bookworm machine, as root: bubblewrap for the local
# backend, and rootful podman serving the Docker API on a unix socket for the docker backend, with the or1 sandbox
# image built without a registry. Idempotent: a second run only checks. Prints `export DOCKER_HOST=...` last.
set -euo pipefail

SOCK_DIR=/run/or1-podman
SOCK="$SOCK_DIR/podman.sock"
IMAGE="${OR1_SANDBOX_IMAGE:-or1-sandbox:latest}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

[ "$(id -u)" = 0 ] || { echo "ci-engine.sh must run as root (rootful podman, apt-get)" >&2; exit 1; }

missing=()
for pkg in bubblewrap podman runc debootstrap curl; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing: ${missing[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# runc rather than crun; cgroupfs and file events because CI machines often have no systemd.
mkdir -p /etc/containers/containers.conf.d
cat > /etc/containers/containers.conf.d/or1.conf <<'CONF'
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
exit_command_delay = 5
CONF

# built, and by the current scripts (an image of older ones may lack a package the judge now provides)
built=$(podman image inspect --format '{{index .Labels "or1.recipe"}}' "$IMAGE" 2>/dev/null || true)
if [ "$built" != "$("$HERE/build-image.sh" --recipe)" ]; then
  "$HERE/build-image.sh" "$IMAGE"
fi

if ! curl -sf --unix-socket "$SOCK" http://d/_ping >/dev/null 2>&1; then
  mkdir -p "$SOCK_DIR"
  rm -f "$SOCK"
  # --time=0: never exit on idle; setsid+nohup: survive the CI step's shell; started from / because it outlives the
  # checkout it was started from, and with a deleted working directory every container start fails ("write child:
  # broken pipe").
  (cd / && exec setsid nohup podman system service --time=0 "unix://$SOCK") >/var/log/or1-podman-service.log 2>&1 </dev/null &
  for _ in $(seq 1 100); do
    curl -sf --unix-socket "$SOCK" http://d/_ping >/dev/null 2>&1 && break
    sleep 0.1
  done
  curl -sf --unix-socket "$SOCK" http://d/_ping >/dev/null || {
    echo "podman service did not come up; see /var/log/or1-podman-service.log" >&2; exit 1; }
fi

echo "export DOCKER_HOST=unix://$SOCK"
