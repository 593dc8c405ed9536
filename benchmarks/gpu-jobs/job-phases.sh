# Sourced by the GPU jobs here (bash), first: the job's environment (gpu-suite.sh's env.sh: ftx, FTX_HOME, the
# results folder as RESULTS), run from the checkout's root. Then a job's `prep` phase (its checkpoints and
# conversions: no backend needed) runs detached beside the backend build, so it outlives the device call that starts
# it; `measure` (the default) runs after the build. The job defines prep(), which ends by writing "done RC" to its state file, then calls
#   job_phase "$@"                  # returns only for measure
#   await_prep STATE_FILE SECONDS   # waits for the detached prep; none was started: runs it now
WORK="${FTX_GPU_WORK:-/tmp/ftx-gpu}"
# shellcheck disable=SC1091
. "$WORK/env.sh"
RESULTS="${FTX_GPU_RESULTS:-$WORK/logs}"
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1

job_phase() {
  case "${1:-measure}" in
    prep)
      setsid nohup bash "$0" prep-now > /dev/null 2>&1 < /dev/null &
      echo "prep started beside the build"
      exit 0 ;;
    prep-now) prep; exit 0 ;;
    measure) ;;
    *) echo "usage: $0 [prep|measure]" >&2; exit 2 ;;
  esac
}

await_prep() {
  local state="$1" seconds="$2"
  [ -f "$state" ] || prep
  for _ in $(seq "$seconds"); do grep -q '^done' "$state" 2>/dev/null && break; sleep 1; done
  echo "prep: $(cat "$state" 2>/dev/null)"
}
