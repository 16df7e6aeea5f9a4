#!/bin/bash
# End-to-end decode, single process vs coordinator + 2 split workers (shm
# doorbell), alternating runs (docs/process-split.md). Needs the 2-layer
# model at /tmp/mx2: build/bin/tandem-make-model --preset mixtral-8x7b --layers 2 --shards 3 --tokenizer=false --out /tmp/mx2
set -u
cd "$(dirname "$0")/.."
ids=$(python3 -c "print(','.join(str(3+(i*7919)%31990) for i in range(128)))")
rd=/tmp/e2e-rt; mkdir -p $rd
for i in 0 1; do
  setsid build/bin/tandem-cpu-worker --model /tmp/mx2 --socket $rd/w$i.sock --worker_index $i --num_workers 2 \
    --division split --transport shm --region_prefix /tandem-e2e-$i > $rd/w$i.log 2>&1 < /dev/null &
  echo $! > $rd/w$i.pid
done
sleep 1
for round in 1 2 3 4 5 6 7 8; do
  build/bin/tandem-generate --model /tmp/mx2 --prompt_ids $ids -n 33 --ignore_eos --json 2>/dev/null | python3 -c "import sys,json; t=json.load(sys.stdin)['timing']; print('single', round(t['prefill_tokens_per_s'],1), round(t['decode_tokens_per_s'],2))"
  build/bin/tandem-generate --model /tmp/mx2 --prompt_ids $ids -n 33 --ignore_eos --json --workers unix:$rd/w0.sock,unix:$rd/w1.sock --transport shm --connect_timeout_ms 120000 2>/dev/null | python3 -c "import sys,json; t=json.load(sys.stdin)['timing']; print('split2', round(t['prefill_tokens_per_s'],1), round(t['decode_tokens_per_s'],2))"
done
kill $(cat $rd/w0.pid) $(cat $rd/w1.pid); sleep 1
