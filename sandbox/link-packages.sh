#!/usr/bin/env bash
# Link the Python packages that LeetCode's judge gives solutions (sortedcontainers, from Debian's
# python3-sortedcontainers) into /usr/lib/or1-sandbox/python under ROOT, the one folder the sandbox runner adds to
# its path (it runs python3 -I -S, so nothing else of dist-packages, native modules included, reaches a test).
# Usage: sandbox/link-packages.sh ROOT (/ for this machine; a root filesystem for an image).
set -euo pipefail
root="${1:?usage: link-packages.sh ROOT}"
folder="$root/usr/lib/or1-sandbox/python"
mkdir -p "$folder"
for package in sortedcontainers; do
  if [ -d "$root/usr/lib/python3/dist-packages/$package" ]; then
    ln -sfn "/usr/lib/python3/dist-packages/$package" "$folder/$package"
  else
    echo "link-packages: $package is not installed under $root (apt-get install python3-$package)" >&2
    exit 1
  fi
done
