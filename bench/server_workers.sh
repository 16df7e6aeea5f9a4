#!/bin/bash
# tandem-server end to end with its experts in two CPU worker processes
# (split, shm doorbell, one core each) against the same server in one
# process (2 threads), on one model file, the two set-ups alternating round
# by round (A B, then B A). Each is started, waited for, driven by
# bench/serving_clients.py (HTTP /v1/completions, greedy, the same requests
# for both) and stopped before the other starts. One JSON line per client
# count and set-up is appended to OUT:
#   bench/server_workers.sh MODEL ROUNDS OUT.jsonl
# Environment: CLIENTS (1,4), REQUESTS (per client, 2), PROMPT (128),
# MAX_TOKENS (32), SLOTS (--max_sequences, 4), PORT (18580: the first
# server's; each later one takes the next), MAX_ID (prompt ids drawn below
# it: 30000; keep it within the vocabulary), TANDEM_FLAGS (extra flags for
# both servers). Needs build/bin/tandem-{server,cpu-worker}.
set -euo pipefail
model=$(realpath "${1:?usage: server_workers.sh MODEL ROUNDS OUT.jsonl}")
rounds=${2:?} out=${3:?}
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${TANDEM_BIN:-$here/build/bin}
clients=${CLIENTS:-1,4} requests=${REQUESTS:-2} prompt=${PROMPT:-128} max_tokens=${MAX_TOKENS:-32}
slots=${SLOTS:-4} port=${PORT:-18580} max_id=${MAX_ID:-30000} tandem_flags=${TANDEM_FLAGS:-}
dir=$(mktemp -d)
pids=()
stop_all() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  pids=()
}
trap 'stop_all; rm -rf "$dir"' EXIT

fail() {
  echo "server_workers.sh: $1; logs:" >&2
  tail -n 20 "$dir"/*.log >&2
  exit 1
}

start_workers() {
  for i in 0 1; do
    "$bin/tandem-cpu-worker" --model "$model" --socket "$dir/w$i.sock" --worker_index $i --num_workers 2 \
      --division split --transport shm --threads 1 --cpus $i --region_prefix "/tandem-sw-$$-$i" \
      --exit_with_parent > "$dir/w$i.log" 2>&1 < /dev/null &
    pids+=($!)
  done
  for i in 0 1; do
    for _ in $(seq 1 1200); do
      grep -q "serving unix" "$dir/w$i.log" 2>/dev/null && continue 2
      kill -0 "${pids[$i]}" 2>/dev/null || fail "worker $i exited before serving"
      sleep 0.5
    done
    fail "worker $i did not serve within 600 s"
  done
}

# start_server SETUP FLAGS...: the server on the next port, waited for.
start_server() {
  local setup=$1
  shift
  port=$((port + 1))
  # shellcheck disable=SC2086
  "$bin/tandem-server" --model "$model" --max_sequences "$slots" --http_listen "$port" "$@" $tandem_flags \
    > "$dir/server-$setup.log" 2>&1 < /dev/null &
  pids+=($!)
  local server=${pids[${#pids[@]} - 1]}
  for _ in $(seq 1 1200); do
    curl -sf "http://127.0.0.1:$port/v1/models" > /dev/null && return 0
    kill -0 "$server" 2>/dev/null || fail "tandem-server ($setup) exited before serving"
    sleep 0.5
  done
  fail "tandem-server ($setup) did not serve within 600 s"
}

measure() {  # SETUP ROUND
  python3 "$here/bench/serving_clients.py" --server "http://127.0.0.1:$port" --clients "$clients" \
    --requests "$requests" --prompt_tokens "$prompt" --max_tokens "$max_tokens" --max_id "$max_id" --label "$1" |
    python3 -c 'import json, sys
for line in sys.stdin:
    row = json.loads(line)
    row.update(setup=sys.argv[1], round=int(sys.argv[2]), model=sys.argv[3], slots=int(sys.argv[4]))
    print(json.dumps(row))' "$1" "$2" "$model" "$slots" >> "$out"
}

run_workers() {
  start_workers
  start_server workers --threads 1 --workers "unix:$dir/w0.sock,unix:$dir/w1.sock" --transport shm
  measure two_split_workers "$1"
  grep -h "slices of" "$dir"/w*.log | head -2 >&2 || true
  stop_all
}

run_one_process() {
  start_server one_process --threads 2
  measure one_process "$1"
  stop_all
}

for round in $(seq 1 "$rounds"); do
  if [ $((round % 2)) = 1 ]; then
    run_workers "$round"; run_one_process "$round"
  else
    run_one_process "$round"; run_workers "$round"
  fi
done
python3 - "$out" <<'EOF'
import json, sys, collections
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')]
res = collections.defaultdict(list)
for r in rows:
    if r.get('bench') == 'serving_clients' and 'setup' in r:
        res[(r['clients'], r['setup'])].append(r['aggregate_tokens_per_s_with_unencodable'])
for (c, setup), v in sorted(res.items()):
    print(f"{c:3} clients  {setup:18} {min(v):7.2f}-{max(v):7.2f} tok/s")
EOF
