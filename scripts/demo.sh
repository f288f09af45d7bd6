#!/usr/bin/env bash
# The main job on a fresh machine: set up, then `trainwatch watch` a 2-rank data-parallel
# training run with a real silent bug (from step 3 the loop calls the raw module instead
# of its DistributedDataParallel wrapper, so gradients are no longer all-reduced and the
# replicas drift apart without any error). The embedded broker, a checker worker and the
# metrics endpoint are started and torn down by `watch` itself.
#
# `watch` exits 1 when it catches a violation; for this demo that is the expected
# outcome, so the script exits 0 when the bug is caught and 1 when it is missed.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck disable=SC1091
. "$ROOT/scripts/bootstrap-env.sh" || exit 2
set +e  # bootstrap-env.sh turns on errexit; watch's exit code is interpreted below
cd "$ROOT"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
trainwatch watch -- python -m torch.distributed.run --standalone --nproc-per-node 2 \
    benchmarks/silent_bugs/ddp_raw_module.py --bug --onset 3 --steps 8
code=$?
case "$code" in
  1) echo "demo: the silent bug was caught (watch exit code 1, as expected)"; exit 0 ;;
  0) echo "demo: no violation reported: the silent bug was missed" >&2; exit 1 ;;
  *) echo "demo: watch failed with exit code $code" >&2; exit "$code" ;;
esac
