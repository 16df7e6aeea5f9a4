#!/usr/bin/env bash
# Starts tandem as several local processes: one CPU expert worker per NUMA node
# (or --workers N) on unix sockets under a runtime dir, waits until every worker
# answers and a token has gone through all of them, and stops them all cleanly.
#
#   deploy/tandem-launch.sh start --model models/demo [--workers 2] [--division split|shard] [--transport shm|inline]
#   deploy/tandem-launch.sh generate --prompt "The licensee may" -n 32     # the coordinator, against the workers
#   deploy/tandem-launch.sh status
#   deploy/tandem-launch.sh stop
#
# The coordinator is tandem-generate for now (the gRPC server comes with the
# serving API); `generate` passes the worker list and transport to it.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
bin="${TANDEM_BIN:-$here/build/bin}"
runtime_dir="${TANDEM_RUNTIME_DIR:-${XDG_RUNTIME_DIR:-/tmp}/tandem-$(id -un)}"

die() { echo "tandem-launch: $*" >&2; exit 1; }

numa_nodes() {
  local n
  n=$(ls -d /sys/devices/system/node/node[0-9]* 2>/dev/null | wc -l)
  [ "$n" -gt 0 ] && echo "$n" || echo 1
}

worker_list() {
  local n; n=$(cat "$runtime_dir/num_workers")
  local list="" i
  for ((i = 0; i < n; i++)); do list+="${list:+,}unix:$runtime_dir/worker-$i.sock"; done
  echo "$list"
}

stop_workers() {
  [ -d "$runtime_dir" ] || return 0
  local pids=() f
  for f in "$runtime_dir"/worker-*.pid; do
    [ -f "$f" ] && pids+=("$(cat "$f")")
  done
  [ ${#pids[@]} -eq 0 ] && return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  local deadline=$((SECONDS + 10)) pid
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  rm -f "$runtime_dir"/worker-*.pid "$runtime_dir/num_workers"
  echo "tandem-launch: stopped ${#pids[@]} worker(s)"
}

cmd="${1:-}"; shift || true
case "$cmd" in
  start)
    model="" workers=0 division=split transport=shm
    while [ $# -gt 0 ]; do
      case "$1" in
        --model) model="$2"; shift 2 ;;
        --workers) workers="$2"; shift 2 ;;
        --division) division="$2"; shift 2 ;;
        --transport) transport="$2"; shift 2 ;;
        --runtime-dir) runtime_dir="$2"; shift 2 ;;
        *) die "start: unknown option $1" ;;
      esac
    done
    [ -n "$model" ] || die "start: --model DIR is required"
    [ -x "$bin/tandem-cpu-worker" ] || die "$bin/tandem-cpu-worker not found: build first (cmake --build build)"
    [ "$workers" -gt 0 ] || workers=$(numa_nodes)
    mkdir -p "$runtime_dir"
    stop_workers
    echo "$workers" > "$runtime_dir/num_workers"
    echo "$model" > "$runtime_dir/model"
    echo "$transport" > "$runtime_dir/transport"
    for ((i = 0; i < workers; i++)); do
      # Each worker plans its own node and cores from its index (common/numa_topology.h).
      setsid "$bin/tandem-cpu-worker" --model "$model" --socket "$runtime_dir/worker-$i.sock" \
        --worker_index "$i" --num_workers "$workers" --division "$division" --transport "$transport" \
        --region_prefix "/tandem-$(id -u)-$i" > "$runtime_dir/worker-$i.log" 2>&1 < /dev/null &
      echo $! > "$runtime_dir/worker-$i.pid"
    done
    # Healthy = every worker connected, its model fingerprint checked, and one
    # token computed through all of them.
    if ! "$bin/tandem-generate" --model "$model" --workers "$(worker_list)" --transport "$transport" \
         --connect_timeout_ms 60000 --prompt_ids 1 -n 1 --json > "$runtime_dir/health.json" 2> "$runtime_dir/health.log"; then
      tail -5 "$runtime_dir"/worker-*.log "$runtime_dir/health.log" >&2 || true
      stop_workers
      die "workers did not become healthy (logs in $runtime_dir)"
    fi
    echo "tandem-launch: $workers worker(s) healthy ($division, $transport) under $runtime_dir"
    ;;
  generate)
    [ -f "$runtime_dir/num_workers" ] || die "no workers running under $runtime_dir: run 'start' first"
    exec "$bin/tandem-generate" --model "$(cat "$runtime_dir/model")" --workers "$(worker_list)" \
      --transport "$(cat "$runtime_dir/transport")" "$@"
    ;;
  status)
    [ -f "$runtime_dir/num_workers" ] || { echo "no workers under $runtime_dir"; exit 0; }
    for f in "$runtime_dir"/worker-*.pid; do
      [ -f "$f" ] || continue
      pid=$(cat "$f")
      if kill -0 "$pid" 2>/dev/null; then state=running; else state=dead; fi
      echo "$(basename "$f" .pid): pid $pid $state"
    done
    ;;
  stop)
    stop_workers
    ;;
  *)
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
