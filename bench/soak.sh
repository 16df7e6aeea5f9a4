#!/usr/bin/env bash
# Soak and chaos bench (issue 15): N clients of mixed greedy generate and
# beam search against tandem-server with 2 CPU workers for a given time,
# while workers are killed, stopped and restarted at random; one JSON line
# (requests done, failed by status code, lost and wrong — both must be 0 —,
# peak and final RSS). Exit status 1 when a request was lost or wrong.
#
#   nice -n 10 bench/soak.sh --duration_s 1800 --clients 16 --out bench/results/soak-zen5-2core.jsonl
#                                                        # the 30-minute run in docs/BENCHMARKS.md (16-64 clients)
#   bench/soak.sh --duration_s 180 --clients 16          # a short one
#
# Options are bench/soak.py's (--help). Needs a build with tandem-server,
# tandem-cpu-worker and the Python SDK: cmake --build build --target
# tandem-server tandem-cpu-worker tandem_python.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
build="${TANDEM_BUILD:-$here/build}"
for f in "$build/bin/tandem-server" "$build/bin/tandem-cpu-worker" "$build/python/tandem/v1/inference_pb2.py"; do
  [ -e "$f" ] || { echo "soak.sh: $f not found: build tandem-server tandem-cpu-worker tandem_python first" >&2; exit 2; }
done
PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}" exec /usr/bin/python3 "$here/bench/soak.py" --bin "$build/bin" "$@"
