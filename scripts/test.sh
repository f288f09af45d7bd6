#!/usr/bin/env bash
# Runs the whole test suite from nothing: system packages, virtualenv, pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/install-system-deps.sh"
# shellcheck disable=SC1091
. "$ROOT/scripts/bootstrap-env.sh"
cd "$ROOT"
exec python -m pytest "$@"
