#!/usr/bin/env bash
# Issue 39: GPT-J-6B shape, tp 2, fp16, batch 1 and 8, greedy: GPT-J's decoder step captured in a CUDA graph
# (FTX_FT_CUDA_GRAPH=1) against the eager path, with ftx's custom all-reduce (2 and 1 all-reduces a layer) and
# with NCCL: tok/s, / HBM bound, and the sha256 of the generated ids against each eager twin. Then a CUPTI trace
# of the graph variant (per-step GPU busy/idle, host launch time) where nvcc and CUPTI are there.
#
# One device call (the backend builds in gpu-suite's job; the checkpoint and its conversion beside it):
#   scripts/gpu-suite.sh start --sources ft-src.tar.xz --wheels WHEELS --no-tests \
#     --after 'bash benchmarks/gpu-jobs/cuda-graph.sh' \
#   && bash benchmarks/gpu-jobs/cuda-graph.sh prep && scripts/gpu-suite.sh wait --max 500
# (a second call, if the first ran out: scripts/gpu-suite.sh wait --max 500). Results in the job's logs folder
# (gpu-logs.tar.gz under $OUT): graph.json, graph.log (the table at its end), graph-capture.txt (the server
# logs' capture lines: each graph variant must say "captured", none "could not be captured").
set -uo pipefail
# shellcheck source=benchmarks/gpu-jobs/job-phases.sh
. "$(dirname "$0")/job-phases.sh"
PROF="$WORK/prof"
mkdir -p "$PROF"

prep() {  # the random GPT-J-6B-shape checkpoint and its tp 2 fp16 conversion (no backend needed)
  echo started > "$PROF/prep.state"
  python3 benchmarks/bench_ft_profile.py --work "$PROF" --prep > "$RESULTS/graph-prep.log" 2>&1
  echo "done $?" > "$PROF/prep.state"
}

job_phase "$@"
# the prep started beside the build: wait for it (at most 5 minutes); none started: prep now
await_prep "$PROF/prep.state" 300

TRACE=()
if nvcc -shared -Xcompiler -fPIC -o "$WORK/libftx_cupti_trace.so" benchmarks/native/cupti_trace.cc -lcupti \
    > "$RESULTS/cupti-build.log" 2>&1; then
  TRACE=(--trace-lib "$WORK/libftx_cupti_trace.so" --trace-variant "custom AR, 2 AR/layer, graph" --trace-after 4)
fi

# the two that answer the issue first; NCCL inside a graph last (a hang there costs only itself)
python3 benchmarks/bench_ft_profile.py --work "$PROF" --batches 1 8 --repeats 3 --json "$RESULTS/graph.json" \
  --variants "custom AR, 2 AR/layer" "custom AR, 2 AR/layer, graph" \
             "custom AR, 1 AR/layer" "custom AR, 1 AR/layer, graph" \
             "NCCL, 2 AR/layer" "NCCL, 2 AR/layer, graph" \
  "${TRACE[@]}" > "$RESULTS/graph.log" 2>&1
rc=$?
# per server log (one per variant, oldest first): the graph's lines (2 "captured" per graph variant: one a rank)
for log in $(ls -tr "${FTX_HOME:-$WORK/home}"/triton/logs/*.log 2>/dev/null); do
  echo "$(basename "$log"): captured $(grep -c 'decoding step captured in a CUDA graph' "$log")," \
    "could not capture $(grep -c "could not be captured" "$log")"
  grep -m 2 'could not be captured' "$log"
done > "$RESULTS/graph-capture.txt"
echo "--- capture lines in the server logs"; cat "$RESULTS/graph-capture.txt"
echo "--- table"; tail -n 16 "$RESULTS/graph.log"
exit $rc
