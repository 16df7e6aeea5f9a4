#!/usr/bin/env bash
# Starts tandem as several local processes: one CPU expert worker per NUMA node
# (or --workers N; 0 = experts inside the server) and the coordinator,
# tandem-server, on unix sockets under a runtime dir; waits until the server
# answers (which means every worker connected and passed its model check);
# and stops them all cleanly.
#
#   deploy/tandem-launch.sh start --model models/demo [--workers 2] [--division split|shard] [--transport shm|inline]
#   deploy/tandem-launch.sh start --synthetic mixtral-8x7b --synthetic_seed 1 --workers 2   (generated in memory: each
#     worker its share of the experts, the server the rest)
#                                 [--listen 127.0.0.1:50051] [--server-args "--max_sequences 32"]
#   deploy/tandem-launch.sh generate --prompt "The licensee may" -n 32     # tandem CLI against the server
#   deploy/tandem-launch.sh beam --prompt "The licensee may" --beam_width 4 -n 16
#   deploy/tandem-launch.sh info | stats [--json]
#   deploy/tandem-launch.sh status
#   deploy/tandem-launch.sh stop
#
# The server listens on unix:<runtime dir>/server.sock, which is also where
# `tandem` and the SDK examples connect by default; the runtime dir is
# $TANDEM_RUNTIME_DIR, else ${XDG_RUNTIME_DIR:-/tmp}/tandem-<user>.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
bin="${TANDEM_BIN:-$here/build/bin}"
runtime_dir="${TANDEM_RUNTIME_DIR:-${XDG_RUNTIME_DIR:-/tmp}/tandem-$(id -un)}"

die() { echo "tandem-launch: $*" >&2; exit 1; }
warn() { echo "tandem-launch: $*" >&2; }
uid=$(id -u)
# Files are created with O_EXCL (noclobber) after removing what was there, and
# readable by this user only: no redirection ever follows a planted symlink.
set -o noclobber
umask 077

# The runtime dir must be ours and private before anything is read from or
# written to it: under /tmp its name is predictable, and another user may
# have created it first, with symlinks and pid files of their own in it.
# With `create`, a missing dir is made (0700); otherwise a missing one is
# fine (nothing to stop or show).
check_runtime_dir() {
  local create="${1:-}"
  if [ -L "$runtime_dir" ]; then
    die "runtime dir $runtime_dir is a symlink (owned by uid $(stat -c %u -- "$runtime_dir")): refusing to follow" \
        "it; remove it, or set TANDEM_RUNTIME_DIR to a folder of your own"
  fi
  if [ ! -e "$runtime_dir" ]; then
    [ -n "$create" ] || return 1
    mkdir -p -m 0700 -- "$runtime_dir" || die "cannot create runtime dir $runtime_dir"
  fi
  [ -d "$runtime_dir" ] && [ ! -L "$runtime_dir" ] || die "runtime dir $runtime_dir is not a directory"
  local owner mode
  owner=$(stat -c %u -- "$runtime_dir")
  mode=$(stat -c %a -- "$runtime_dir")
  if [ "$owner" != "$uid" ]; then
    die "runtime dir $runtime_dir is owned by uid $owner (mode $mode), not by you (uid $uid): another user may" \
        "have created it to take over tandem's sockets, logs and pid files; remove it, or set TANDEM_RUNTIME_DIR" \
        "to a folder of your own"
  fi
  if (( 8#$mode & 8#022 )); then
    die "runtime dir $runtime_dir has mode $mode: others may write to it; chmod 0700 it (or remove it) first"
  fi
  chmod 0700 -- "$runtime_dir"
  return 0
}

# A file of the runtime dir about to be (re)written: never a symlink or
# anything but a regular file; removed so the redirection creates it afresh.
fresh_file() {
  local f="$1"
  if [ -L "$f" ] || { [ -e "$f" ] && [ ! -f "$f" ]; }; then
    die "$f is a symlink or not a regular file: refusing to write through it"
  fi
  rm -f -- "$f"
}

# The pid in pid file $1 (empty when absent or not a number); a symlink is refused.
read_pid() {
  local f="$1" pid=""
  [ -e "$f" ] || [ -L "$f" ] || return 0
  if [ -L "$f" ] || [ ! -f "$f" ]; then die "$f is a symlink or not a regular file: refusing to read it"; fi
  read -r pid < "$f" || true
  [[ "$pid" =~ ^[0-9]+$ ]] && echo "$pid"
  return 0
}

# Whether pid $1 is a live process of this user running program $2
# (tandem-server or tandem-cpu-worker): a pid file naming anything else (a
# reused pid, another user's process) is never signalled.
ours() {
  local pid="$1" program="$2" exe
  [ -n "$pid" ] && [ -d "/proc/$pid" ] || return 1
  [ "$(stat -c %u "/proc/$pid" 2>/dev/null)" = "$uid" ] || return 1
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
  exe="${exe% (deleted)}"
  [ "$(basename -- "$exe")" = "$program" ]
}

# The program a pid file's process must be running.
program_of() { case "$(basename -- "$1")" in server.pid) echo tandem-server ;; *) echo tandem-cpu-worker ;; esac; }

numa_nodes() {
  local n
  n=$(ls -d /sys/devices/system/node/node[0-9]* 2>/dev/null | wc -l)
  [ "$n" -gt 0 ] && echo "$n" || echo 1
}

worker_list() {
  local n; n=$(read_pid "$runtime_dir/num_workers"); n=${n:-0}
  local list="" i
  for ((i = 0; i < n; i++)); do list+="${list:+,}unix:$runtime_dir/worker-$i.sock"; done
  echo "$list"
}

# SIGTERM to the process of every pid file matching $1 that is ours and the
# expected program, then SIGKILL after 10 s; the pid files are removed.
stop_pids() {
  local pattern="$1" pids=() f pid
  for f in "$runtime_dir"/$pattern; do
    [ -e "$f" ] || [ -L "$f" ] || continue
    pid=$(read_pid "$f")
    if ours "$pid" "$(program_of "$f")"; then
      pids+=("$pid")
    elif [ -n "$pid" ] && [ -d "/proc/$pid" ]; then
      warn "$f names pid $pid, which is not your $(program_of "$f"): not signalling it"
    fi
    rm -f -- "$f"
  done
  [ ${#pids[@]} -eq 0 ] && return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  local deadline=$((SECONDS + 10))
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  echo "tandem-launch: stopped ${#pids[@]} process(es) ($pattern)"
}

# What a killed worker left behind (its shm regions, listed in its lock file
# <socket>.lock, the stale socket and the lock file) stays until a worker on
# that socket starts again; tandem-cpu-worker --reclaim removes it with the
# same checks (refused while a live worker holds the lock).
reclaim_workers() {
  local lock i reclaimed=0
  for lock in "$runtime_dir"/worker-*.sock.lock; do
    [ -e "$lock" ] || [ -L "$lock" ] || continue
    i="${lock##*/worker-}"; i="${i%.sock.lock}"
    [[ "$i" =~ ^[0-9]+$ ]] || continue
    if [ -x "$bin/tandem-cpu-worker" ] &&
       "$bin/tandem-cpu-worker" --reclaim --socket "$runtime_dir/worker-$i.sock" --worker_index "$i" \
         --num_workers "$((i + 1))" --region_prefix "/tandem-$uid-$i" > /dev/null 2>&1; then
      reclaimed=$((reclaimed + 1))
    else
      warn "could not reclaim what worker $i left behind ($lock)"
    fi
  done
  [ "$reclaimed" -eq 0 ] || echo "tandem-launch: reclaimed the shm regions, socket and lock of $reclaimed stopped worker(s)"
}

stop_all() {
  check_runtime_dir || return 0
  stop_pids "server.pid"   # the coordinator first: it fails its requests cleanly
  stop_pids "worker-*.pid"
  reclaim_workers
  rm -f -- "$runtime_dir/num_workers"
}

server_address() { echo "unix:$runtime_dir/server.sock"; }

cmd="${1:-}"; shift || true
case "$cmd" in
  start)
    model="" synthetic="" seed=0 workers=-1 division=split transport=shm listen="" server_args=""
    while [ $# -gt 0 ]; do
      case "$1" in
        --model) model="$2"; shift 2 ;;
        --synthetic) synthetic="$2"; shift 2 ;;
        --synthetic_seed) seed="$2"; shift 2 ;;
        --workers) workers="$2"; shift 2 ;;
        --division) division="$2"; shift 2 ;;
        --transport) transport="$2"; shift 2 ;;
        --listen) listen="$2"; shift 2 ;;
        --server-args) server_args="$2"; shift 2 ;;
        --runtime-dir) runtime_dir="$2"; shift 2 ;;
        *) die "start: unknown option $1" ;;
      esac
    done
    # The programs check the pair themselves (exactly one of the two).
    model_flags=()
    [ -z "$model" ] || model_flags+=(--model "$model")
    [ -z "$synthetic" ] || model_flags+=(--synthetic "$synthetic" --synthetic_seed "$seed")
    [ -n "$model$synthetic" ] || die "start: --model DIR or --synthetic PRESET[:layers] is required"
    for b in tandem-server tandem-cpu-worker tandem; do
      [ -x "$bin/$b" ] || die "$bin/$b not found: build first (cmake --build build)"
    done
    [[ "$workers" =~ ^-?[0-9]+$ ]] || die "start: --workers must be a number, got \"$workers\""
    [ "$workers" -ge 0 ] || workers=$(numa_nodes)
    check_runtime_dir create
    stop_all
    fresh_file "$runtime_dir/num_workers"
    echo "$workers" > "$runtime_dir/num_workers"
    for ((i = 0; i < workers; i++)); do
      fresh_file "$runtime_dir/worker-$i.log"
      fresh_file "$runtime_dir/worker-$i.pid"
      # Each worker plans its own node and cores from its index (common/platform/numa_topology.h);
      # its shm region names get a random suffix of its own.
      setsid "$bin/tandem-cpu-worker" "${model_flags[@]}" --socket "$runtime_dir/worker-$i.sock" \
        --worker_index "$i" --num_workers "$workers" --division "$division" --transport "$transport" \
        --region_prefix "/tandem-$uid-$i" > "$runtime_dir/worker-$i.log" 2>&1 < /dev/null &
      echo $! > "$runtime_dir/worker-$i.pid"
    done
    server_flags=("${model_flags[@]}" --listen "$(server_address)${listen:+,$listen}")
    if [ "$workers" -gt 0 ]; then
      server_flags+=(--workers "$(worker_list)" --transport "$transport" --connect_timeout_ms 60000)
    fi
    # shellcheck disable=SC2086  # --server-args is a list of flags
    fresh_file "$runtime_dir/server.log"
    fresh_file "$runtime_dir/server.pid"
    setsid "$bin/tandem-server" "${server_flags[@]}" $server_args > "$runtime_dir/server.log" 2>&1 < /dev/null &
    server_pid=$!
    echo "$server_pid" > "$runtime_dir/server.pid"
    # Healthy = the server answers, which it does only after every worker
    # connected and passed its fingerprint check.
    # Generating a full-size synthetic model takes minutes, not seconds.
    wait_s=120
    [ -z "$synthetic" ] || wait_s=900
    deadline=$((SECONDS + wait_s))
    until "$bin/tandem" info --server "$(server_address)" > /dev/null 2>&1; do
      if ! kill -0 "$server_pid" 2>/dev/null || [ $SECONDS -ge $deadline ]; then
        tail -5 "$runtime_dir"/*.log >&2 || true
        stop_all
        die "the server did not come up (logs in $runtime_dir)"
      fi
      sleep 0.2
    done
    echo "tandem-launch: server on $(server_address)${listen:+ and $listen} with $workers worker(s)" \
         "($division, $transport), logs under $runtime_dir"
    ;;
  generate|beam|info|stats|tokenize|detokenize)
    check_runtime_dir && [ -n "$(read_pid "$runtime_dir/server.pid")" ] ||
      die "no server under $runtime_dir: run 'start' first"
    exec "$bin/tandem" "$cmd" --server "$(server_address)" "$@"
    ;;
  status)
    check_runtime_dir || { echo "nothing under $runtime_dir"; exit 0; }
    for f in "$runtime_dir"/server.pid "$runtime_dir"/worker-*.pid; do
      [ -e "$f" ] || [ -L "$f" ] || continue
      pid=$(read_pid "$f")
      if ours "$pid" "$(program_of "$f")"; then state=running; else state="dead (or not your $(program_of "$f"))"; fi
      echo "$(basename "$f" .pid): pid ${pid:-?} $state"
    done
    if [ -n "$(read_pid "$runtime_dir/server.pid")" ]; then "$bin/tandem" stats --server "$(server_address)" || true; fi
    ;;
  stop)
    stop_all
    ;;
  *)
    sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
