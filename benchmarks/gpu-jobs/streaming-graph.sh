#!/usr/bin/env bash
# A streaming deployment of GPT-J in fp16 (where the CUDA graph is on when not streaming) at tp 2 and tp 4: ftx
# serves it with FTX_FT_CUDA_GRAPH=0, since every streamed request hung (tp 2) or ended the server (tp 4) with the
# graph on. The serving matrix's streaming variant (`raw-route` beside the raw loop tells the model's cost of the
# inputs the OpenAI token route sends from the endpoint's own), then the GPU suite's streamed-text test at each tp.
# Needs tp GPUs (four for tp 4; at tp 2 only: FTX_STREAM_TPS=2). What hung is reproduced by stream_bisect.py here.
#
# One device call (the backend builds in gpu-suite's job; the checkpoint and its conversions beside it):
#   scripts/gpu-suite.sh start --sources ft-src.tar.xz --wheels WHEELS --no-tests \
#     --after 'bash benchmarks/gpu-jobs/streaming-graph.sh' \
#   && bash benchmarks/gpu-jobs/streaming-graph.sh prep && scripts/gpu-suite.sh wait --max 500
# Results in the job's logs folder: serving-stream-v*.md (the tables), graph-capture.txt (every server log's capture,
# fallback and fault lines), suite-streaming.log.
set -uo pipefail
# shellcheck source=benchmarks/gpu-jobs/job-phases.sh
. "$(dirname "$0")/job-phases.sh"
SW="$WORK/stream-work"
TPS="${FTX_STREAM_TPS:-2,4}"
mkdir -p "$SW"
ftx() { python3 -c 'from ftx_triton.cli import main; main()' "$@"; }

prep() {  # the random GPT-J-6B-shape checkpoint (one character per id) and its conversion at each tp
  echo started > "$SW/prep.state"
  python3 -c "import sys; sys.path.insert(0, 'benchmarks')
from pathlib import Path
from seed_shapes import random_checkpoint
random_checkpoint('gptj', Path('$SW/checkpoint-gptj'), full_vocab=True)" > "$RESULTS/stream-prep.log" 2>&1
  for tp in ${TPS//,/ }; do
    ftx -v run "$SW/checkpoint-gptj" --runtime fastertransformer-native --tp "$tp" --no-tune --until convert \
      >> "$RESULTS/stream-prep.log" 2>&1
  done
  echo "done $?" > "$SW/prep.state"
}

job_phase "$@"
await_prep "$SW/prep.state" 300
variants=()
for tp in ${TPS//,/ }; do variants+=("--tp $tp --streaming --no-tune -v"); done
FTX_SERVING_WORK="$SW" FTX_SERVING_TAG=serving-stream \
  FTX_SERVING_VARIANTS="$(IFS=';'; echo "${variants[*]}")" \
  FTX_SERVING_BENCH='--concurrency 1,32,64 --paths raw-loop,raw-route,text,openai --max-tokens 128' \
  bash scripts/serving-matrix.sh "$RESULTS" shape:gptj --runtime fastertransformer-native > "$RESULTS/serving-stream.log" 2>&1
echo "serving matrix rc=$?"
grep -h "captured\|could not be captured\|NCCL error\|Signal (" "$FTX_HOME"/triton/logs/bench-v*.log | sort | uniq -c \
  > "$RESULTS/graph-capture.txt"
cat "$RESULTS/graph-capture.txt"
FTX_GPU_TPS="$TPS" FTX_GPU_DTYPES=fp16 python3 -m pytest -m gpu tests/gpu/test_native_ft.py \
  -k "streamed_text_through_the_ensemble" -v -rA -p no:cacheprovider > "$RESULTS/suite-streaming.log" 2>&1
echo "suite (streamed text) rc=$? $(tail -n 1 "$RESULTS/suite-streaming.log")"
