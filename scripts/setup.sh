#!/usr/bin/env bash
# Create .venv with ftx, its four plugins and (with --dev) the test tools; idempotent.
# Usage: scripts/setup.sh [--dev]
set -euo pipefail
cd "$(dirname "$0")/.."
dev=0; [ "${1:-}" = "--dev" ] && dev=1
venv=.venv
hash=$(cat pyproject.toml requirements-dev.txt core/pyproject.toml plugins/*/pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
stamp="$venv/.ftx-setup-$hash-$dev"

if [ "$dev" = 1 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  # Tests drive a real Docker daemon (its stand-in image is built from busybox-static) and mpirun.
  missing=()
  command -v dockerd >/dev/null || missing+=(docker.io)
  command -v mpirun >/dev/null || missing+=(openmpi-bin)
  dpkg -s busybox-static >/dev/null 2>&1 || missing+=(busybox-static)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: apt-get install ${missing[*]}" >&2
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
fi

if [ -f "$stamp" ] || { [ "$dev" = 0 ] && [ -f "$venv/.ftx-setup-$hash-1" ]; }; then
  exit 0  # up to date (a dev install also serves the plain one)
fi
echo "setup: creating $venv (first run takes about a minute)" >&2
python3 -m venv "$venv"
pip="$venv/bin/pip"
"$pip" install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" >&2 || true
# The CPU build of torch (a CUDA build is several GB): pinned so pip takes the local wheel.
"$pip" install -q "torch==2.13.0" 2>&1 | grep -v "^WARNING: Location" >&2 || true
extras=()
[ "$dev" = 1 ] && extras+=(-r requirements-dev.txt)
"$pip" install -q -e "core[torch,serve]" -e plugins/gptj -e plugins/t5 -e plugins/gptneox -e plugins/kogpt \
  "${extras[@]}" 2>&1 | grep -v "^WARNING: Location" >&2 || true
"$venv/bin/python" -c "import ftx, ftx_gptj, ftx_t5, ftx_gptneox, ftx_kogpt, torch, transformers, tritonclient, pytriton" \
  || { echo "setup: the install is incomplete (see pip output above)" >&2; exit 1; }
rm -f "$venv"/.ftx-setup-*
touch "$stamp"
echo "setup: done ($venv)" >&2
