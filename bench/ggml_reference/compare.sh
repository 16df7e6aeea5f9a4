#!/bin/bash
# tandem beside ggml (llama.cpp's kernels, through mixtral_ggml.cc) on the
# same GGUF files, rounds alternating engine by engine so the shared
# machine's noise spreads over both. One JSON line per run, appended to OUT:
# ggml's own object, and tandem-generate-bench's machine / generate /
# decode_breakdown / prefill lines, each stamped with the round and file,
# and a read-bandwidth probe (engine "probe") right before and after each
# ggml run. bench/ggml_reference/summarize.py OUT.jsonl --markdown tables it.
#   bench/ggml_reference/compare.sh MIXTRAL_GGML OUT.jsonl ROUNDS FILE.gguf...
# Environment: PROMPT (512), DECODE (32), REPS (2), THREADS (2),
# WEIGHTS ("quantized experts": tandem's --gguf_weights values to run).
set -eu
ggml=${1:?usage: compare.sh MIXTRAL_GGML OUT.jsonl ROUNDS FILE.gguf...}
out=$2
rounds=$3
shift 3
cd "$(dirname "$0")/../.."
prompt=${PROMPT:-512} decode=${DECODE:-32} reps=${REPS:-2} threads=${THREADS:-2}
stamp() { python3 -c "
import json, os, sys
for line in sys.stdin:
    line = line.strip()
    if not line.startswith('{'): continue
    d = json.loads(line)
    d.update({'round': $1, 'file': os.path.basename('$2'), 'engine': d.get('engine', 'tandem'),
              'load_avg_1m': os.getloadavg()[0]})
    print(json.dumps(d))"; }
probe() {
  build/bin/tandem-generate-bench --presets= --threads "$threads" 2>/dev/null |
    python3 -c "import json, sys; [print(json.dumps(dict(json.loads(l), engine='probe'))) for l in sys.stdin if l.startswith('{')]" |
    stamp "$1" "$2" >> "$out"
}
for round in $(seq "$rounds"); do
  for file in "$@"; do
    # The read-only bandwidth right before and after ggml's run, as
    # tandem-generate-bench probes around its own decode (summarize.py).
    probe "$round" "$file"
    "$ggml" --model "$file" --prompt_tokens "$prompt" -n $((decode + 1)) --reps "$reps" --threads "$threads" |
      stamp "$round" "$file" >> "$out"
    probe "$round" "$file"
    for weights in ${WEIGHTS:-quantized experts}; do
      build/bin/tandem-generate-bench --model_dir "$file" --gguf_weights "$weights" --prompt_tokens "$prompt" \
        --decode_tokens "$decode" --reps "$reps" --threads "$threads" 2>/dev/null | stamp "$round" "$file" >> "$out"
    done
  done
done
echo "appended to $out" >&2
