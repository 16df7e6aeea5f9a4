#!/usr/bin/env bash
# HTTP soak and chaos bench: bench/http_soak.py against tandem-server's
# OpenAI HTTP API with 2 CPU workers faulted at random; one JSON line (lost,
# wrong and misjudged must be 0; the server's RSS flat). Exit status 1 when
# a request was lost or wrong, or a malformed one not refused as it should be.
#
#   nice -n 10 bench/http_soak.sh --duration_s 1800 --clients 32 --out bench/results/http-soak-zen5-2core.jsonl
#   bench/http_soak.sh --duration_s 120 --clients 16     # a short one
#
# Options are bench/http_soak.py's (--help). Needs tandem-server and
# tandem-cpu-worker: cmake --build build --target tandem-server tandem-cpu-worker.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
build="${TANDEM_BUILD:-$here/build}"
for f in "$build/bin/tandem-server" "$build/bin/tandem-cpu-worker"; do
  [ -e "$f" ] || { echo "http_soak.sh: $f not found: build tandem-server tandem-cpu-worker first" >&2; exit 2; }
done
exec /usr/bin/python3 "$here/bench/http_soak.py" --bin "$build/bin" "$@"
