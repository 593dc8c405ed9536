#!/usr/bin/env bash
# Install ftx from this checkout as packages: build its five distributions as wheels (ftx-triton and the
# ftx-triton-{gptj,t5,gptneox,kogpt} plugins) and install them, with core's torch extra and the embedded
# tritonserver (nvidia-pytriton, without its numpy<2 pin), into the environment of PYTHON (default: python3;
# e.g. ~/venvs/ftx/bin/python). Until the distributions are on the package index this is the install for
# users; their dependencies come from the package index.
# Usage: scripts/install.sh [--python PYTHON] [--cpu-torch] [--wheels-only DIR]
#   --cpu-torch       install torch's CPU build first (the default wheel is the CUDA build, several GB)
#   --wheels-only DIR build the wheels into DIR and install nothing (what the release workflow checks)
set -euo pipefail
cd "$(dirname "$0")/.."
python=python3; cpu_torch=0; only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --python) python="$2"; shift 2 ;;
    --cpu-torch) cpu_torch=1; shift ;;
    --wheels-only) only="$2"; shift 2 ;;
    *) echo "install: unknown option $1 (use --python PYTHON, --cpu-torch, --wheels-only DIR)" >&2; exit 2 ;;
  esac
done
distributions=(./core ./plugins/gptj ./plugins/t5 ./plugins/gptneox ./plugins/kogpt)
out="${only:-$(mktemp -d)}"
mkdir -p "$out"
echo "install: building ${#distributions[@]} wheels into $out" >&2
"$python" -m pip wheel --no-deps --quiet -w "$out" "${distributions[@]}"
if [ -n "$only" ]; then
  ls "$out"/*.whl
  exit 0
fi
if [ "$cpu_torch" = 1 ]; then
  "$python" -m pip install --quiet torch --index-url https://download.pytorch.org/whl/cpu
fi
core=$(ls "$out"/ftx_triton-[0-9]*.whl)
plugins=$(ls "$out"/ftx_triton_*.whl)
echo "install: installing $(basename "$core")[torch] and $(echo "$plugins" | wc -w) plugins" >&2
# shellcheck disable=SC2086  # one wheel path per word
"$python" -m pip install --quiet "$core[torch]" $plugins
"$python" -m pip install --quiet --no-deps nvidia-pytriton  # the embedded tritonserver, without its numpy<2 pin
"$python" -m ftx_triton --version
