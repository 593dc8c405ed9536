#!/usr/bin/env bash
# Wheels for running ftx's native FasterTransformer path on an offline GPU host whose Python already has
# PyTorch, transformers, numpy 2, grpcio, protobuf, rich, pluggy, click, psutil, aiohttp and huggingface_hub
# (a typical CUDA PyTorch image): ftx and its four plugins, the few packages such images lack, and a
# numpy 1 wheel for the Python-backend stubs' side environment (their numpy bridge is numpy-1 only).
#
#   scripts/offline-wheels.sh DIR [PYTHON_VERSION]      (default 3.12)
#
# Then, on the GPU host: scripts/gpu-suite.sh all --wheels DIR --sources ft-upstream-sources.tar.xz
# --slim: drop tritonclient's perf_analyzer binaries (40 MB; only its Python client is needed there) and
# re-compress the largest wheels with LZMA, for transfer limits. DIR/tritonserver-libs.tar.xz: the shared
# libraries tritonserver's python backend needs, from the local nvidia-pytriton install.
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:?usage: scripts/offline-wheels.sh DIR [PYTHON_VERSION] [--slim]}"; pyver="${2:-3.12}"; slim=0
for arg in "$@"; do [ "$arg" = --slim ] && slim=1; done
[ "$pyver" = --slim ] && pyver=3.12
mkdir -p "$dest"
py=.venv/bin/python; [ -x "$py" ] || py=python3
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
# tritonclient's gRPC client needs python-rapidjson; ftx's core needs the rest.
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp "${platforms[@]}" \
  -d "$dest" structlog tomlkit zstandard platformdirs docker python-rapidjson "tritonclient==2.51.0" "numpy<2"
"$py" -m pip wheel -q --no-deps -w "$dest" ./core ./plugins/gptj ./plugins/t5 ./plugins/gptneox ./plugins/kogpt
if [ "$slim" = 1 ]; then
  "$py" - "$dest" <<'PY'
import copy, pathlib, sys, zipfile
for wheel in pathlib.Path(sys.argv[1]).glob("*.whl"):
    drop_bins = wheel.name.startswith("tritonclient-")
    if not drop_bins and wheel.stat().st_size < (4 << 20):
        continue
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_LZMA) as out:
        for info in src.infolist():
            if drop_bins and "/data/bin/" in info.filename:
                continue
            data = src.read(info.filename)
            packed = copy.copy(info)
            packed.compress_type = zipfile.ZIP_LZMA
            out.writestr(packed, data)
    tmp.replace(wheel)
PY
fi
# The trimmed tritonserver shipped with the FasterTransformer sources lacks the shared libraries its
# python backend links (libarchive and the three it needs beyond the trimmed set); the nvidia-pytriton wheel bundles them.
libs="$("$py" -c 'import importlib.util as u, pathlib; print(pathlib.Path(u.find_spec("pytriton").origin).parent.parent / "nvidia_pytriton.libs")' 2>/dev/null || true)"
if [ -n "$libs" ] && [ -d "$libs" ]; then
  (cd "$libs" && tar cJf - libarchive-*.so* libacl-*.so* liblz4-*.so* libbz2-*.so*) > "$dest/tritonserver-libs.tar.xz"
else
  echo "warning: nvidia-pytriton is not installed here; $dest has no tritonserver-libs.tar.xz" >&2
fi
du -sh "$dest"
