#!/usr/bin/env bash
# Usage: scripts/gpu-device-bundle.sh [DIR]     (default DIR: .device, which .gitignore ignores)
# On the CPU machine (Debian 12 with apt, PyPI reachable): makes what scripts/gpu-device-check.sh
# needs on the lent GPU machine, which has no network:
#   DIR/dock.tar.xz   Debian 12's dockerd, containerd, runc, docker-init, busybox and the
#                     libraries dockerd links (../shared/gpu-device/make-docker-bundle.sh)
#   DIR/wheels/       docker-py and its dependencies, PyYAML, pydantic (binary wheels for
#                     CPython 3.10-3.13, manylinux x86_64): the GPU machine's Python
#                     (/opt/torch/.venv) judges the check with hp's own code
# Carry DIR with the device tool (carry: [".device"]); it must stay under 64 MiB in all.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath -m "${1:-$here/.device}")
maker=${HP_DOCKER_BUNDLE_MAKER:-$here/../shared/gpu-device/make-docker-bundle.sh}
mkdir -p "$out/wheels"
[ -f "$out/dock.tar.xz" ] || bash "$maker" "$out"
pip=${PIP:-pip3}
for v in 3.10 3.11 3.12 3.13; do
  $pip download -q --only-binary=:all: --python-version "$v" --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --implementation cp -d "$out/wheels" \
    "docker==7.1.0" "PyYAML>=6" "pydantic>=2.7,<3"
done
du -sh "$out"; ls "$out/wheels" | wc -l
total=$(du -sb "$out" | cut -f1)
[ "$total" -lt $((64 * 1024 * 1024)) ] || { echo "too big to carry: $total bytes (64 MiB at most)" >&2; exit 1; }
