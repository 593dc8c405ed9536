#!/usr/bin/env bash
# Issue 39: `ftx run` of an fp32 checkpoint for fp16 compute, cold: the converted bytes and the seconds to ready with
# the weight files in the compute type (`--weight-dtype auto`, the default on FasterTransformer runtimes) against
# fp32 files (`--weight-dtype fp32`, what ftx converted before). GPT-J-6B shape, random fp32 (24 GB), tp 2, native
# runtime, untuned; the backend already built in the job's FTX_HOME (gpu-suite.sh).
#
#   bash benchmarks/gpu-jobs/weight-dtype-cold.sh prep     # the fp32 checkpoint, detached (beside the build)
#   bash benchmarks/gpu-jobs/weight-dtype-cold.sh          # the two cold runs, after the build
#
# The source's content key is computed by the first run (its fetch step) and remembered, so the second run's fetch
# is cached: compare the convert and "tritonserver ready" steps, and the totals less fetch. Results in the job's
# logs folder: weight-dtype-cold.md (the table), weight-dtype-<dtype>.log (each run's -v timeline).
set -uo pipefail
# shellcheck source=benchmarks/gpu-jobs/job-phases.sh
. "$(dirname "$0")/job-phases.sh"
CK="$WORK/fp32-gptj"
ftx() { python3 -c 'from ftx_triton.cli import main; main()' "$@"; }

prep() {
  echo started > "$CK.state"
  python3 -c "import sys, torch; sys.path.insert(0, 'benchmarks')
from pathlib import Path
from seed_shapes import random_model, save
model = random_model('gptj', Path('$CK'), 'cuda').float()
model.config.torch_dtype = torch.float32
save(model, Path('$CK'))" > "$RESULTS/weight-dtype-prep.log" 2>&1
  echo "done $?" > "$CK.state"
}

job_phase "$@"
await_prep "$CK.state" 600
grep -q '^done 0' "$CK.state" || { echo "error: no fp32 checkpoint (see weight-dtype-prep.log)" >&2; exit 1; }
source_gb=$(du -sb --apparent-size "$CK" | awk '{printf "%.1f", $1/1e9}')
{
  echo "| \`--weight-dtype\` | converted GB | fetch s | convert s | tritonserver ready s | total s | total less fetch s |"
  echo "|---|---:|---:|---:|---:|---:|---:|"
} > "$RESULTS/weight-dtype-cold.md"
for dtype in auto fp32; do
  log="$RESULTS/weight-dtype-$dtype.log"
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true  # cold page cache where allowed
  ftx -v run "$CK" --runtime fastertransformer-native --tp 2 --no-tune --weight-dtype "$dtype" --detach \
    --name "cold-$dtype" > "$log" 2>&1
  rc=$?
  ftx stop "cold-$dtype" >> "$log" 2>&1
  line=$(grep 'timeline total=' "$log" | tail -n 1)
  get() { echo "$line" | grep -o "$1=[0-9.]*" | head -n 1 | cut -d= -f2; }
  dir=$(ls -td "$FTX_HOME"/store/convert/*/ | head -n 1)  # this run's conversion: the newest
  gb=$(du -sb --apparent-size "$dir" 2>/dev/null | awk '{printf "%.1f", $1/1e9}')
  total=$(get total); fetch=$(get fetch)
  less=$(python3 -c "print(round(${total:-0} - ${fetch:-0}, 2))")
  echo "| $dtype (rc $rc) | $gb | $fetch | $(get convert) | $(echo "$line" | grep -o 'tritonserver ready=[0-9.]*' | cut -d= -f2) | $total | $less |" \
    >> "$RESULTS/weight-dtype-cold.md"
done
echo "source: $source_gb GB of fp32 safetensors" >> "$RESULTS/weight-dtype-cold.md"
cat "$RESULTS/weight-dtype-cold.md"
