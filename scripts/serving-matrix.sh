#!/usr/bin/env bash
# Serving-under-load figures of one model in several deployment variants, one after the other:
#
#   scripts/serving-matrix.sh OUT MODEL [ftx run arguments...]
#
# MODEL is what `ftx run` takes, or `shape:NAME` for a random checkpoint of a published shape
# (benchmarks/seed_shapes.py; made on the GPU once, under FTX_SERVING_WORK, default OUT). For each variant (FTX_SERVING_VARIANTS:
# `;`-separated extra `ftx run` arguments; default: streaming with 1 and with 4 text-model instances, then
# not streaming) it starts `ftx run MODEL ARGS VARIANT --detach`, runs benchmarks/bench_serving.py against it
# (FTX_SERVING_BENCH: its arguments, e.g. `--soak-seconds 300 --concurrency 64` for a soak) and stops it. A
# variant's leading NAME=VALUE words are environment for its `ftx run` (`FTX_SEGMENT_TOKENS=32 --tp 2 ...`).
# Per variant i, OUT gets TAG-vI.args (the variant), TAG-vI.run.log, TAG-vI.md (the tables), TAG-vI.json
# and TAG-vI.log (the load generator), TAG being FTX_SERVING_TAG (default `serving`; keep that prefix under
# scripts/gpu-suite.sh, whose report returns serving-* files: `serving-soak` for instance).
# Run it with the Python that has ftx installed (PYTHON, default python3). A variant that fails to start, or
# whose load generator fails (a soak that FAILs), is reported, the next one runs, and the script exits 1.
set -uo pipefail

OUT="$1"; MODEL="$2"; shift 2
PY="${PYTHON:-python3}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEFAULT_VARIANTS="--streaming --text-instances 1;--streaming --text-instances 4;--no-streaming"
IFS=';' read -ra VARIANTS <<< "${FTX_SERVING_VARIANTS:-$DEFAULT_VARIANTS}"
read -ra BENCH_ARGS <<< "${FTX_SERVING_BENCH:-}"
TAG="${FTX_SERVING_TAG:-serving}"
STATUS=0
mkdir -p "$OUT"

ftx() { "$PY" -c 'from ftx_triton.cli import main; main()' "$@"; }
stamp() { echo "[$(date -u +%H:%M:%S)] $*"; }

PROMPT=()
if [[ "$MODEL" == shape:* ]]; then
  # a tokenizer with one character per id (every generated id is one character of text), and a prompt of
  # 64 of its tokens
  shape="${MODEL#shape:}"
  MODEL="${FTX_SERVING_WORK:-$OUT}/checkpoint-$shape"
  if [ ! -f "$MODEL/config.json" ]; then
    stamp "making a random $shape checkpoint in $MODEL"
    "$PY" -c "import sys, torch; sys.path.insert(0, '$ROOT/benchmarks')
from pathlib import Path
from seed_shapes import random_checkpoint
random_checkpoint('$shape', Path('$MODEL'), full_vocab=True, device='cuda' if torch.cuda.is_available() else 'cpu')" ||
      { echo "error: could not make the $shape checkpoint" >&2; exit 1; }
  fi
  PROMPT=(--prompt "$("$PY" -c "import sys; sys.path.insert(0, '$ROOT/benchmarks')
from seed_shapes import vocab_characters
print(''.join(vocab_characters(65)[1:]))")")
fi

i=0
for variant in "${VARIANTS[@]}"; do
  i=$((i + 1)); tag="$TAG-v$i"; name="bench-v$i"
  read -ra extra <<< "$variant"
  envs=()
  while [ ${#extra[@]} -gt 0 ] && [[ "${extra[0]}" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; do
    envs+=("${extra[0]}"); extra=("${extra[@]:1}")
  done
  echo "$* $variant" > "$OUT/$tag.args"
  stamp "$tag: ${envs[*]} ftx run $MODEL $* ${extra[*]} --detach --name $name"
  if ! env "${envs[@]}" "$PY" -c 'from ftx_triton.cli import main; main()' run "$MODEL" "$@" "${extra[@]}" \
      --detach --name "$name" > "$OUT/$tag.run.log" 2>&1; then
    stamp "$tag: the deployment did not start; its log ends:"; tail -n 20 "$OUT/$tag.run.log"
    ftx stop "$name" > /dev/null 2>&1
    STATUS=1
    continue
  fi
  stamp "$tag: ready; load"
  if ! "$PY" "$ROOT/benchmarks/bench_serving.py" "$name" --json "$OUT/$tag.json" "${PROMPT[@]}" "${BENCH_ARGS[@]}" \
      > "$OUT/$tag.md" 2> "$OUT/$tag.log"; then
    stamp "$tag: the load generator failed or its soak FAILED (see $tag.log)"; STATUS=1
  fi
  cat "$OUT/$tag.md"
  ftx stop "$name" >> "$OUT/$tag.run.log" 2>&1
  stamp "$tag: stopped"
done
exit $STATUS
