#!/usr/bin/env bash
# Copy this worktree's code into <main>/.native (ignored there) for the device machine, which receives the main
# checkout plus carried ignored folders, and build ftx's wheels into <main>/.whl.
set -euo pipefail
MAIN="${1:-/work/main}"
HERE="$(cd "$(dirname "$0")/.." && pwd)"
rm -rf "$MAIN/.native" && mkdir -p "$MAIN/.native"
tar -C "$HERE" --exclude .venv --exclude .git --exclude tests/golden --exclude __pycache__ --exclude '*.egg-info' \
  -cf - core plugins tests benchmarks scripts pyproject.toml | tar -C "$MAIN/.native" -xf -
rm -f "$MAIN"/.whl/ftx*.whl
"$HERE/.venv/bin/pip" wheel -q --no-deps --no-build-isolation -w "$MAIN/.whl" \
  "$HERE/core" "$HERE"/plugins/gptj "$HERE"/plugins/gptneox "$HERE"/plugins/kogpt "$HERE"/plugins/t5
du -sh "$MAIN/.native" "$MAIN/.whl"
