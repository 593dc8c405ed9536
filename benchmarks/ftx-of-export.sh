#!/bin/sh
# ftx of another version, for `bench_cached_run.py --ftx`: FTX_BEFORE_ROOT is a `git archive` export of it
# (e.g. `git archive main | tar -x -C /tmp/ftx-main`); its sources go first on PYTHONPATH (before what it held), this
# python runs them. Byte-compile the export first (`python -m compileall -q EXPORT`): where PYTHONDONTWRITEBYTECODE=1
# is set, an uncompiled export compiles its sources in every run (0.1 CPU-s of a convert's start and plan).
ROOT=${FTX_BEFORE_ROOT:?set FTX_BEFORE_ROOT to the export of the version to measure}
PYTHONPATH="$ROOT/core/src:$ROOT/plugins/gptj/src:$ROOT/plugins/gptneox/src:$ROOT/plugins/kogpt/src:$ROOT/plugins/t5/src${PYTHONPATH:+:$PYTHONPATH}" \
    exec python3 -c 'import sys; from ftx_triton.entry import main; sys.argv[0] = "ftx"; sys.exit(main())' "$@"
