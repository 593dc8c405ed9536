#!/usr/bin/env bash
# Issue 40's GPU target: a cached GPT-J-6B (random fp16 weights) ready in at most 6 s at tp 1 or 2. The checkpoint
# and its conversion are made beside the backend build (prep); after the build, one run at the tp warms every stage
# (tune off, the repository written), then FTX_READY_RUNS cached runs (default 4) of the same deployment, each
# stopped before the next, their `-v` timelines read into one table of step seconds (median and range).
#
# One device call, the backend built in gpu-suite's job:
#   scripts/gpu-suite.sh start --sources ft-src.tar.xz --wheels WHEELS --no-tests \
#     --after 'bash benchmarks/gpu-jobs/cached-ready.sh' \
#   && bash benchmarks/gpu-jobs/cached-ready.sh prep && scripts/gpu-suite.sh wait --max 520
# FTX_READY_TP (default 2). Results in the job's logs folder: cached-ready.md (the table), cached-ready-*.log.
set -uo pipefail
# shellcheck source=benchmarks/gpu-jobs/job-phases.sh
. "$(dirname "$0")/job-phases.sh"
CW="$WORK/ready-work"
TP="${FTX_READY_TP:-2}"
RUNS="${FTX_READY_RUNS:-4}"
mkdir -p "$CW"
ftx() { python3 -c 'from ftx_triton.cli import main; main()' "$@"; }
serve() { ftx -v run "$CW/checkpoint-gptj" --runtime fastertransformer-native --tp "$TP" --no-tune --detach --name ready "$@"; }

prep() {  # the random GPT-J-6B-shape checkpoint and its conversion at the tp
  echo started > "$CW/prep.state"
  python3 -c "import sys; sys.path.insert(0, 'benchmarks')
from pathlib import Path
from seed_shapes import random_checkpoint
random_checkpoint('gptj', Path('$CW/checkpoint-gptj'))" > "$RESULTS/cached-ready-prep.log" 2>&1
  ftx -v run "$CW/checkpoint-gptj" --runtime fastertransformer-native --tp "$TP" --no-tune --until convert \
    >> "$RESULTS/cached-ready-prep.log" 2>&1
  echo "done $?" > "$CW/prep.state"
}

job_phase "$@"
await_prep "$CW/prep.state" 400
serve > "$RESULTS/cached-ready-warm.log" 2>&1
echo "warm run rc=$?"
ftx stop ready >> "$RESULTS/cached-ready-warm.log" 2>&1
for i in $(seq "$RUNS"); do
  serve > "$RESULTS/cached-ready-$i.log" 2>&1
  echo "cached run $i rc=$?"
  ftx stop ready >> "$RESULTS/cached-ready-$i.log" 2>&1
done
python3 - "$RESULTS" "$RUNS" "$TP" <<'EOF' | tee "$RESULTS/cached-ready.md"
import re, statistics, sys
from pathlib import Path

results, runs, tp = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
steps: dict[str, list[float]] = {}
for i in range(1, runs + 1):
    totals = 0.0
    for line in (results / f"cached-ready-{i}.log").read_text().splitlines():
        name, seconds = re.search(r"step=('[^']*'|\S+)", line), re.search(r"seconds=([0-9.]+)", line)
        if "timeline.step" in line and name and seconds:
            steps.setdefault(name[1].strip("'"), []).append(float(seconds[1]))
            totals += float(seconds[1])
    steps.setdefault("total to ready", []).append(totals)
print(f"| cached GPT-J-6B at tp {tp}, -v timeline step | median s | range s |")
print("|---|---:|---|")
for name, values in steps.items():
    print(f"| {name} | {statistics.median(values):.2f} | {min(values):.2f}-{max(values):.2f} |")
EOF
