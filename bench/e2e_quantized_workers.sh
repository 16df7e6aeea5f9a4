#!/bin/bash
# End-to-end decode with 2 split CPU workers (shm doorbell) whose stores hold
# the demo model's experts as BF16 (the safetensors folder) or in their GGUF
# blocks (--gguf_experts quantized on workers and coordinator), rounds
# alternating between the three so machine noise spreads over all of them
# (docs/BENCHMARKS.md, "Quantized types and accuracy"). One JSON line per run on stdout.
#   bench/e2e_quantized_workers.sh [ROUNDS] [TOKENS]
# Makes /tmp/tandem-qw/demo (tandem-make-model --preset demo) and its q8_0 and
# q4_k_m GGUFs once; needs build/bin/tandem-{make-model,quantize,cpu-worker,generate}.
set -u
cd "$(dirname "$0")/.."
rounds=${1:-3}
tokens=${2:-65}
dir=/tmp/tandem-qw
mkdir -p $dir
[ -f $dir/demo/config.json ] || build/bin/tandem-make-model --preset demo --seed 1 --out $dir/demo > $dir/make.log 2>&1
for t in q8_0 q4_k_m; do
  [ -f $dir/demo-$t.gguf ] || build/bin/tandem-quantize --model $dir/demo --type $t --out $dir/demo-$t.gguf > $dir/q-$t.log 2>&1
done
ids=$(python3 -c "print(','.join(str(3+(i*7919)%1990) for i in range(32)))")

# start_workers MODEL GGUF_EXPERTS: two split workers, one core each.
start_workers() {
  for i in 0 1; do
    rm -f $dir/w$i.sock
    setsid build/bin/tandem-cpu-worker --model "$1" --gguf_experts "$2" --socket $dir/w$i.sock --worker_index $i \
      --num_workers 2 --division split --transport shm --threads 1 --cpus $i --region_prefix /tandem-qw-$i \
      > $dir/w$i.log 2>&1 < /dev/null &
    echo $! > $dir/w$i.pid
  done
  for i in 0 1; do
    for _ in $(seq 100); do grep -q "serving unix" $dir/w$i.log 2>/dev/null && break; sleep 0.2; done
  done
}
stop_workers() {
  for i in 0 1; do kill "$(cat $dir/w$i.pid)" 2>/dev/null; done
  for i in 0 1; do
    for _ in $(seq 50); do kill -0 "$(cat $dir/w$i.pid)" 2>/dev/null || break; sleep 0.1; done
  done
}

for round in $(seq "$rounds"); do
  for case in bf16:$dir/demo:bf16 q8_0:$dir/demo-q8_0.gguf:quantized q4_k_m:$dir/demo-q4_k_m.gguf:quantized; do
    IFS=: read -r name model mode <<< "$case"
    start_workers "$model" "$mode"
    store=$(grep -o "slices of [^,]*, [0-9.]* MiB of weights" $dir/w0.log | head -1)
    build/bin/tandem-generate --model "$model" --gguf_experts "$mode" --prompt_ids "$ids" -n "$tokens" --ignore_eos \
      --json --threads 1 --workers unix:$dir/w0.sock,unix:$dir/w1.sock --transport shm 2> $dir/gen.log |
      python3 -c "
import sys, json
t = json.load(sys.stdin)['timing']
print(json.dumps({'bench': 'e2e_quantized_workers', 'model': 'demo', 'experts': '$name', 'round': $round,
                  'workers': 2, 'division': 'split', 'worker0_store': '$store', 'tokens': $tokens,
                  'prefill_tokens_per_s': round(t['prefill_tokens_per_s'], 1),
                  'decode_tokens_per_s': round(t['decode_tokens_per_s'], 2)}))" || tail -5 $dir/gen.log >&2
    stop_workers
  done
done
