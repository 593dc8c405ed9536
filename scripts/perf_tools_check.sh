#!/usr/bin/env bash
# Run perf_analyzer and genai-perf briefly against ftx's built-in tiny-gptj (python runtime), to
# show that they work with ftx's repositories: perf_analyzer on the raw fastertransformer model
# (HTTP) and the generate ensemble (gRPC); genai-perf on the ensemble, unstreamed and streamed
# (a streamed answer must count as many output tokens as an unstreamed one).
#
# Needs the network for package registries only (pip), the first time:
#  * perf_analyzer: the binary ships in tritonclient's manylinux wheels up to 2.51 (the Triton
#    release nvidia-pytriton 0.7 embeds); later wheels are pure Python and the PyPI package
#    "perf-analyzer" is a placeholder. It needs libb64 and libcudart, which nvidia_pytriton.libs has.
#  * genai-perf 0.0.8: the release that drives that perf_analyzer (newer ones pass options it lacks).
# Both go to a cache directory (default ~/.cache/ftx-perf-tools), never into the project's venv.
# Usage: scripts/perf_tools_check.sh [CACHE_DIR]      (no timings are claimed: it only checks they run)
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/ftx-perf-tools}
venv=.venv
ftx="$venv/bin/ftx"
mkdir -p "$cache/bin" "$cache/libs"

if [ ! -x "$cache/perf_analyzer" ]; then
  "$venv/bin/pip" download -q --no-deps "tritonclient==2.51.0" --platform manylinux1_x86_64 \
    --only-binary=:all: -d "$cache/wheel" 2>&1 | grep -v "^WARNING: Location" >&2 || true
  unzip -o -q -j "$cache"/wheel/tritonclient-2.51.0-*.whl "tritonclient-2.51.0.data/data/bin/perf_analyzer" -d "$cache"
  chmod +x "$cache/perf_analyzer"
fi
libs=$("$venv/bin/python" -c "import nvidia_pytriton, pathlib; print(pathlib.Path(nvidia_pytriton.__file__).parent.parent / 'nvidia_pytriton.libs')" 2>/dev/null \
  || "$venv/bin/python" -c "import pytriton, pathlib; print(pathlib.Path(pytriton.__file__).parent.parent / 'nvidia_pytriton.libs')")
ln -sf "$(ls "$libs"/libb64-*.so.0d | head -1)" "$cache/libs/libb64.so.0d"
ln -sf "$(ls "$libs"/libcudart-*.so.12* | head -1)" "$cache/libs/libcudart.so.12"
cat > "$cache/bin/perf_analyzer" <<EOF
#!/bin/sh
LD_LIBRARY_PATH="$cache/libs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "$cache/perf_analyzer" "\$@"
EOF
chmod +x "$cache/bin/perf_analyzer"
if [ ! -x "$cache/genai-venv/bin/genai-perf" ]; then
  python3 -m venv "$cache/genai-venv"
  "$cache/genai-venv/bin/pip" install -q "genai-perf==0.0.8" 2>&1 | grep -v "^WARNING: Location" >&2 || true
fi
export PATH="$cache/bin:$PATH" HF_HUB_OFFLINE=1

work=$(mktemp -d)
server=""
cleanup() { [ -z "$server" ] || "$ftx" stop "$server" >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT

serve() {  # serve [ftx run options]: detach a tiny-gptj server; sets $server, $http, $grpc
  "$ftx" run tiny-gptj --runtime python --device cpu --detach "$@" > "$work/run.out"
  server=$(sed -n "s/^left running as '\(.*\)'.*/\1/p" "$work/run.out")
  read -r http grpc < <("$ftx" ps --json | "$venv/bin/python" -c \
    "import json,sys; r=[s for s in json.load(sys.stdin) if s['name']=='$server'][0]; print(r['http_url'], r['grpc_url'])")
}
unserve() { "$ftx" stop "$server" >/dev/null; server=""; }

genai() {  # genai TAG [--streaming]: the average output sequence length genai-perf measured
  (cd "$work" && "$cache/genai-venv/bin/genai-perf" profile -m text --service-kind triton --backend tensorrtllm \
     -u "$grpc" --tokenizer "$tokenizer" --synthetic-input-tokens-mean 16 --output-tokens-mean 8 --concurrency 2 \
     --measurement-interval 3000 --random-seed 7 --artifact-dir "$work/$1" "${@:2}" > "$work/$1.txt")
  "$venv/bin/python" -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['output_sequence_length']['avg'])" \
    "$(find "$work/$1" -name profile_export_genai_perf.json | head -1)"
}

tokenizer=$("$venv/bin/python" -c "from ftx_gptj.tiny import DEMO; from ftx_triton.engine.builtin import ensure_builtin; from ftx_triton.paths import ftx_home; print(ensure_builtin(ftx_home(), 'tiny-gptj', DEMO))" 2>/dev/null | tail -1)
serve
echo "== perf_analyzer: fastertransformer over HTTP ($http)"
cat > "$work/ft.json" <<'EOF'
{"data": [{"input_ids": {"content": [5, 6, 7, 8, 9, 10, 11, 12], "shape": [8]},
           "input_lengths": {"content": [8], "shape": [1]}, "request_output_len": {"content": [8], "shape": [1]}}]}
EOF
perf_analyzer -m fastertransformer -u "$http" --input-data "$work/ft.json" --measurement-mode count_windows \
  --measurement-request-count 8 --stability-percentage 999 --max-trials 3 --concurrency-range 2 | tail -3
echo "== perf_analyzer: text ensemble over gRPC ($grpc)"
cat > "$work/gen.json" <<'EOF'
{"data": [{"text_input": {"content": ["Once upon a time"], "shape": [1]}, "max_tokens": {"content": [8], "shape": [1]}}]}
EOF
perf_analyzer -m text -i grpc -u "$grpc" --input-data "$work/gen.json" --measurement-mode count_windows \
  --measurement-request-count 8 --stability-percentage 999 --max-trials 3 --concurrency-range 2 | tail -2
echo "== genai-perf: text ensemble, unstreamed"
classic_len=$(genai classic)
unserve
serve --streaming
echo "== genai-perf: text ensemble, streamed (each piece of text once)"
stream_len=$(genai streamed --streaming)
echo "average output sequence length: unstreamed $classic_len, streamed $stream_len"
"$venv/bin/python" -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(0 if b <= 1.5 * a else 1)" \
  "$classic_len" "$stream_len" || { echo "streamed answers count more tokens than unstreamed ones" >&2; exit 1; }
echo "perf_analyzer and genai-perf ran against ftx's python runtime"
