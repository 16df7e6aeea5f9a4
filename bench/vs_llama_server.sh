#!/bin/bash
# Serving side by side: tandem-server against a llama.cpp-family engine's own
# llama-server on the same GGUF file, the same concurrent clients and the
# same requests (bench/serving_clients.py), engines alternating round by
# round (A B, then B A) so a shared host's drift falls on both alike. Each
# server is started, waited for, measured at every client count, and
# stopped before the other starts. Every JSON line is kept, tagged:
#   bench/vs_llama_server.sh LLAMA_SERVER ROUNDS OUT.jsonl FILE.gguf
# LLAMA_SERVER is the other engine's llama-server, built by you out of tree
# (this repository holds no recipe for it). Environment: THREADS (2),
# CLIENTS (1,4,16), REQUESTS (per client, 4), PROMPT (128), MAX_TOKENS (64),
# SLOTS (the other server's -np, 16; tandem's --max_sequences likewise),
# LLAMA_FLAGS ("-fa 1 -rtr", ik_llama.cpp's CPU flags; "" for llama.cpp),
# TANDEM_FLAGS (extra tandem-server flags), PORT (18480: the first server's;
# each later one takes the next, as a port the previous server closed
# connections on stays in TIME_WAIT, which a listener without SO_REUSEADDR
# leaves unbindable for a minute).
set -eu
llama_server=${1:?usage: vs_llama_server.sh LLAMA_SERVER ROUNDS OUT.jsonl FILE.gguf}
case "$llama_server" in */*) llama_server=$(realpath "$llama_server") ;; esac
rounds=${2:?} out=${3:?} file=$(realpath "${4:?}")
here=$(cd "$(dirname "$0")/.." && pwd)
tandem_server=${TANDEM_SERVER:-$here/build/bin/tandem-server}
threads=${THREADS:-2} clients=${CLIENTS:-1,4,16} requests=${REQUESTS:-4}
prompt=${PROMPT:-128} max_tokens=${MAX_TOKENS:-64} slots=${SLOTS:-16} port=${PORT:-18480}
llama_flags=${LLAMA_FLAGS--fa 1 -rtr}
tandem_flags=${TANDEM_FLAGS:-}
# Each slot holds one request's prompt and output, with room to spare.
context=$((slots * (prompt + max_tokens + 64)))
log=$(mktemp)
scratch=$(mktemp -d)  # the other server's working directory (it writes llama.log there)
server_pid=
stop_server() {
  if [ -n "$server_pid" ]; then
    kill "$server_pid" 2>/dev/null || true
    for _ in $(seq 1 20); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$server_pid" 2>/dev/null || true  # a server still draining must not answer the next one's port
    wait "$server_pid" 2>/dev/null || true
    server_pid=
  fi
}
trap 'stop_server; rm -rf "$log" "$scratch"' EXIT

next_port() {  # a port no server answers on (a stale one would be measured instead)
  port=$((port + 1))
  if curl -sf "http://127.0.0.1:$port/v1/models" > /dev/null; then
    echo "vs_llama_server.sh: something already serves on port $port; set PORT" >&2
    exit 1
  fi
}

wait_ready() {
  for _ in $(seq 1 600); do
    if ! kill -0 "$server_pid" 2>/dev/null; then
      echo "vs_llama_server.sh: $1 exited before serving; its log:" >&2
      tail -20 "$log" >&2
      exit 1
    fi
    if curl -sf "http://127.0.0.1:$port/v1/models" > /dev/null; then return 0; fi
    sleep 1
  done
  echo "vs_llama_server.sh: $1 did not serve within 600 s" >&2
  exit 1
}

measure() {  # ENGINE ROUND FLAGS
  python3 "$here/bench/serving_clients.py" --server "http://127.0.0.1:$port" --clients "$clients" \
    --requests "$requests" --prompt_tokens "$prompt" --max_tokens "$max_tokens" --label "$1" |
    python3 -c 'import json, sys
for line in sys.stdin:
    row = json.loads(line)
    row.update(engine=sys.argv[1], round=int(sys.argv[2]), flags=sys.argv[3], model=sys.argv[4],
               threads=int(sys.argv[5]), slots=int(sys.argv[6]))
    print(json.dumps(row))' "$1" "$2" "$3" "$file" "$threads" "$slots" >> "$out"
}

run_llama() {
  next_port
  # shellcheck disable=SC2086
  (cd "$scratch" && exec "$llama_server" -m "$file" -t "$threads" -np "$slots" -c "$context" --port "$port" \
    $llama_flags) > "$log" 2>&1 &
  server_pid=$!
  wait_ready llama-server
  measure llama-server "$1" "$llama_flags"
  stop_server
}

run_tandem() {
  next_port
  # shellcheck disable=SC2086
  "$tandem_server" --model "$file" --threads "$threads" --max_sequences "$slots" --http_listen "$port" \
    $tandem_flags > "$log" 2>&1 &
  server_pid=$!
  wait_ready tandem-server
  measure tandem "$1" "$tandem_flags"
  stop_server
}

for round in $(seq 1 "$rounds"); do
  if [ $((round % 2)) = 1 ]; then
    run_llama "$round"; run_tandem "$round"
  else
    run_tandem "$round"; run_llama "$round"
  fi
done
python3 - "$out" <<'EOF'
import json, sys, collections
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')]
res = collections.defaultdict(list)
for r in rows:
    if r.get('bench') == 'serving_clients':
        res[(r['clients'], r['engine'])].append(r['aggregate_tokens_per_s_with_unencodable'])
for c in sorted({k[0] for k in res}):
    t, o = res[(c, 'tandem')], res[(c, 'llama-server')]
    if t and o:
        ratios = [a / b for a, b in zip(t, o)]
        print(f"{c:3} clients  tandem {min(t):7.1f}-{max(t):7.1f}  other {min(o):7.1f}-{max(o):7.1f}  "
              f"tandem/other {min(ratios):.2f}-{max(ratios):.2f} tok/s")
EOF
