#!/usr/bin/env bash
# Create a venv with ftx, its four plugins and (with --dev) the test tools; idempotent.
# Usage: scripts/setup.sh [--dev] [--modern]
#   (default)  .venv         the pinned set CI runs (numpy<2, transformers<5: scripts/constraints-pinned.txt)
#   --modern   .venv-modern  today's releases (numpy 2, transformers 5), no pins: proves ftx runs on them
#   --dev      + pytest and friends, Docker/MPI for the Docker tests (as root), perf_analyzer for `ftx bench`
# Packages come from the package index (PyPI), so the first run needs it; torch is the local CPU wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
dev=0; modern=0
for arg in "$@"; do
  case "$arg" in
    --dev) dev=1 ;;
    --modern) modern=1 ;;
    *) echo "setup: unknown option $arg (use --dev, --modern)" >&2; exit 2 ;;
  esac
done
venv=.venv; constraints=(-c scripts/constraints-pinned.txt)
if [ "$modern" = 1 ]; then venv=.venv-modern; constraints=(); fi
hash=$(cat pyproject.toml requirements-dev.txt core/pyproject.toml plugins/*/pyproject.toml scripts/setup.sh \
  scripts/constraints-pinned.txt | sha256sum | cut -c1-16)
stamp="$venv/.ftx-setup-$hash-$dev"
started=$SECONDS
step() { echo "setup: [$(( SECONDS - started ))s] $*" >&2; }
# pip's own progress, one line per package (Collecting/Downloading/Installing), without the noise.
pip_quietly() {
  "$venv/bin/pip" "$@" --progress-bar off 2>&1 \
    | grep --line-buffered -E "^(Collecting|Downloading|Installing collected|Successfully installed|ERROR|error)" \
    | sed -u -e 's/^/setup:   /' -e 's/\(Successfully installed.\{0,150\}\).*/\1 …/' >&2 || true
}

if [ "$dev" = 1 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  # Tests drive a real Docker daemon (its stand-in image is built from busybox-static), mpirun and a
  # one-node Slurm cluster (slurm-wlm, munge; srun --mpi=pmix loads libpmix.so from libpmix-dev);
  # perf_analyzer needs libb64.
  missing=()
  command -v dockerd >/dev/null || missing+=(docker.io)
  command -v mpirun >/dev/null || missing+=(openmpi-bin)
  dpkg -s busybox-static >/dev/null 2>&1 || missing+=(busybox-static)
  dpkg -s libb64-0d >/dev/null 2>&1 || missing+=(libb64-0d)
  command -v slurmctld >/dev/null || missing+=(slurm-wlm)
  command -v munged >/dev/null || missing+=(munge)
  dpkg -s libpmix-dev >/dev/null 2>&1 || missing+=(libpmix-dev)
  if [ ${#missing[@]} -gt 0 ]; then
    step "apt-get install ${missing[*]} (Debian packages for the Docker and Slurm tests and perf_analyzer)"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
fi

if [ -f "$stamp" ] || { [ "$dev" = 0 ] && [ -f "$venv/.ftx-setup-$hash-1" ]; }; then
  exit 0  # up to date (a dev install also serves the plain one)
fi
step "creating $venv ($([ "$modern" = 1 ] && echo "modern set: numpy 2, transformers 5" || echo "pinned set"))"
python3 -m venv "$venv"
pip_quietly install --upgrade pip
step "installing torch (the CPU build from the local wheel; a CUDA build is several GB)"
pip_quietly install "torch==2.13.0"
extras=()
[ "$dev" = 1 ] && extras+=(-r requirements-dev.txt)
modern_pins=()
[ "$modern" = 1 ] && modern_pins+=("numpy>=2" "transformers>=5")
step "installing ftx, its plugins and their dependencies${extras:+ and the test tools}"
pip_quietly install "${constraints[@]}" -e "core[torch,serve]" -e plugins/gptj -e plugins/t5 -e plugins/gptneox \
  -e plugins/kogpt "${modern_pins[@]}" "${extras[@]}"
# Only the wheel's tritonserver binary and its libraries are used: --no-deps keeps its numpy<2 pin out.
step "installing nvidia-pytriton's tritonserver (--no-deps: its numpy<2 pin does not apply to this environment)"
pip_quietly install --no-deps "nvidia-pytriton>=0.5"
if [ "$dev" = 1 ]; then
  # perf_analyzer (for `ftx bench`) ships in tritonclient 2.41's manylinux wheel; only its binary is taken,
  # with the CUDA runtime library it links (the nvidia-cuda-runtime-cu12 wheel). Optional: ftx bench
  # falls back to its own load generator when this fails.
  step "installing perf_analyzer for ftx bench (binary from the tritonclient 2.41 wheel, libcudart from PyPI)"
  if tmp=$(mktemp -d) && "$venv/bin/pip" download -q --no-deps --only-binary=:all: "tritonclient==2.41.1" -d "$tmp" \
      >/dev/null 2>&1 && pip_quietly install nvidia-cuda-runtime-cu12 \
      && "$venv/bin/python" - "$tmp" "$venv" <<'EOF'
import pathlib, stat, sys, zipfile
tmp, venv = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]).resolve()
wheel = next(tmp.glob("tritonclient-*.whl"))
with zipfile.ZipFile(wheel) as zf:
    name = next(n for n in zf.namelist() if n.endswith("/bin/perf_analyzer"))
    target = venv / "libexec" / "perf_analyzer"
    target.parent.mkdir(exist_ok=True)
    target.write_bytes(zf.read(name))
    target.chmod(0o755)
import nvidia.cuda_runtime as cr
libs = pathlib.Path(list(cr.__path__)[0]) / "lib"
wrapper = venv / "bin" / "perf_analyzer"
wrapper.write_text(f'#!/bin/sh\nLD_LIBRARY_PATH="{libs}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}" exec "{target}" "$@"\n')
wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
EOF
  then step "perf_analyzer installed ($venv/bin/perf_analyzer)"
  else step "perf_analyzer could not be installed; ftx bench will use its built-in load generator"
  fi
  rm -rf "${tmp:-/nonexistent}"
fi
if [ "$dev" = 1 ]; then
  # fastertransformer_backend's client scripts (tests/integration/server/test_upstream_scripts.py) use np.bool, gone in
  # numpy 1.24: they run with $venv/clients, numpy 1.23 first and this environment's packages after it.
  step "creating $venv/clients (numpy<1.24 for fastertransformer_backend's client scripts)"
  rm -rf "$venv/clients"
  python3 -m venv "$venv/clients"
  "$venv/clients/bin/pip" install -q --progress-bar off "numpy>=1.23,<1.24" 2>&1 | sed -u 's/^/setup:   /' >&2
  main_site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  clients_site=$("$venv/clients/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  echo "$main_site" > "$clients_site/ftx-main-environment.pth"
fi
step "checking the install"
"$venv/bin/python" -c "
import importlib.util, sys
import ftx_triton, ftx_gptj, ftx_t5, ftx_gptneox, ftx_kogpt, torch, transformers, tritonclient, numpy
assert importlib.util.find_spec('pytriton'), 'nvidia-pytriton is missing'
print(f'setup:   numpy {numpy.__version__}, transformers {transformers.__version__}, torch {torch.__version__}',
      file=sys.stderr)" || { echo "setup: the install is incomplete (see pip output above)" >&2; exit 1; }
rm -f "$venv"/.ftx-setup-*
touch "$stamp"
step "done ($venv)"
