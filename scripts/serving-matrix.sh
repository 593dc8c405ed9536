#!/usr/bin/env bash
# Serving-under-load figures of one model in several deployment variants, one after the other:
#
#   scripts/serving-matrix.sh OUT MODEL [ftx run arguments...]
#
# MODEL is what `ftx run` takes, or `shape:NAME` for a random checkpoint of a published shape
# (benchmarks/seed_shapes.py; made on the GPU once, under FTX_SERVING_WORK, default OUT). For each variant (FTX_SERVING_VARIANTS:
# `;`-separated extra `ftx run` arguments; default: streaming with 1 and with 4 text-model instances, then
# not streaming) it starts `ftx run MODEL ARGS VARIANT --detach`, runs benchmarks/bench_serving.py against it
# (FTX_SERVING_BENCH: its arguments) and stops it. Per variant i, OUT gets serving-vI.args (the variant),
# serving-vI.run.log, serving-vI.md (the tables), serving-vI.json and serving-vI.log (the load generator).
# Run it with the Python that has ftx installed (PYTHON, default python3). A variant that fails to start is
# reported and the next one runs.
set -uo pipefail

OUT="$1"; MODEL="$2"; shift 2
PY="${PYTHON:-python3}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEFAULT_VARIANTS="--streaming --text-instances 1;--streaming --text-instances 4;--no-streaming"
IFS=';' read -ra VARIANTS <<< "${FTX_SERVING_VARIANTS:-$DEFAULT_VARIANTS}"
read -ra BENCH_ARGS <<< "${FTX_SERVING_BENCH:-}"
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
  i=$((i + 1)); tag="serving-v$i"; name="bench-v$i"
  read -ra extra <<< "$variant"
  echo "$* $variant" > "$OUT/$tag.args"
  stamp "$tag: ftx run $MODEL $* $variant --detach --name $name"
  if ! ftx run "$MODEL" "$@" "${extra[@]}" --detach --name "$name" > "$OUT/$tag.run.log" 2>&1; then
    stamp "$tag: the deployment did not start; its log ends:"; tail -n 20 "$OUT/$tag.run.log"
    ftx stop "$name" > /dev/null 2>&1
    continue
  fi
  stamp "$tag: ready; load"
  "$PY" "$ROOT/benchmarks/bench_serving.py" "$name" --json "$OUT/$tag.json" "${PROMPT[@]}" "${BENCH_ARGS[@]}" \
    > "$OUT/$tag.md" 2> "$OUT/$tag.log" || stamp "$tag: the load generator failed (see $tag.log)"
  cat "$OUT/$tag.md"
  ftx stop "$name" >> "$OUT/$tag.run.log" 2>&1
  stamp "$tag: stopped"
done
