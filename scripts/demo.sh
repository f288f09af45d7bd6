#!/usr/bin/env bash
# The main job on a fresh machine: set up, then watch a bundled training run with a silent bug.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck disable=SC1091
. "$ROOT/scripts/bootstrap-env.sh"
cd "$ROOT"
exec trainwatch collect -o "${TRACE_DIR:-$ROOT/traces/demo}" -- python examples/mlp.py --steps 20
