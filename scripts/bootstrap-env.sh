#!/usr/bin/env bash
# Creates (or reuses) .venv with everything trainwatch and its test-suite need.
# Sourced by demo.sh and test.sh so that each works on a fresh machine by itself.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
if [ ! -x "$ROOT/.venv/bin/python" ]; then
  "$PY" -m venv "$ROOT/.venv"
fi
# shellcheck disable=SC1091
. "$ROOT/.venv/bin/activate"
STAMP="$ROOT/.venv/.trainwatch-installed"
if [ ! -f "$STAMP" ] || [ "$ROOT/pyproject.toml" -nt "$STAMP" ]; then
  python -m pip install -q --upgrade pip
  # torch is pinned to the CPU wheel that is available locally; anything else downloads gigabytes.
  python -m pip install -q "torch==2.13.0"
  python -m pip install -q -e "$ROOT[test]"
  touch "$STAMP"
fi
