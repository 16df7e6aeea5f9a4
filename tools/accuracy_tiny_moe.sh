#!/bin/bash
# The accuracy table of docs/BENCHMARKS.md: quantizes a model folder (the one
# tools/train_tiny_moe.py writes) to each GGUF type and measures, with
# tandem-perplexity, the perplexity over its held-out text and the mean
# per-token KL divergence from the bf16 folder, one JSON line per (type, mode).
#   tools/accuracy_tiny_moe.sh build/tiny-moe bench/results/accuracy-tiny-moe.jsonl
# Environment: BIN (default build/bin), CONTEXT (128: the training length),
# STRIDE (64), THREADS (2), TYPES (q8_0 q6_k q5_k_m q4_k_m q4_0),
# MODES (the --gguf_experts and --gguf_dense values to run: quantized bf16).
# The GGUF files go to MODEL_DIR-gguf/. Prints the Markdown table of
# docs/BENCHMARKS.md from OUT.jsonl at the end (also alone: --table OUT.jsonl).
set -euo pipefail

# table OUT.jsonl: the rows against the first (the bf16 folder).
table() {
  python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1], encoding="utf-8")]
base, modes = rows[0], {"folder": "bf16 (HF folder)", "quantized": "quantized blocks", "bf16": "dequantized to bf16"}
params = base["file_bytes"] / 2  # the folder's bf16 weights
print("| type | experts run as | weights file | bits/weight | perplexity | vs bf16 | mean KL (nats) | max KL | top-1 agreement |")
print("|---|---|---|---|---|---|---|---|---|")
for r in rows:
    name = r["type"] if r["type"] == "bf16" else r["type"].upper()
    print(f"| {name} | {modes[r['gguf_experts']]} | {r['file_bytes'] / 1e6:.2f} MB | {r['file_bytes'] * 8 / params:.2f} "
          f"| {r['perplexity']:.3f} | {100 * (r['perplexity'] / base['perplexity'] - 1):+.2f}% | {r['mean_kl']:.6f} "
          f"| {r['max_kl']:.3f} | {100 * r['top1_agreement']:.2f}% |")
PY
}
if [[ $# -eq 2 && $1 == --table ]]; then
  table "$2"
  exit 0
fi
if [[ $# -ne 2 ]]; then
  echo "usage: $0 MODEL_DIR OUT.jsonl  |  $0 --table OUT.jsonl" >&2
  exit 2
fi
model=$1
out=$2
bin=${BIN:-build/bin}
context=${CONTEXT:-128}
stride=${STRIDE:-64}
threads=${THREADS:-2}
types=${TYPES:-q8_0 q6_k q5_k_m q4_k_m q4_0}
modes=${MODES:-quantized bf16}
text=$model/heldout.txt
for f in "$model/config.json" "$model/model.safetensors" "$text" "$bin/tandem-perplexity" "$bin/tandem-quantize"; do
  [[ -e $f ]] || { echo "$0: $f not found" >&2; exit 1; }
done
gguf_dir=${model%/}-gguf
mkdir -p "$gguf_dir"
: >"$out"

# measure TYPE MODE MODEL WEIGHTS_FILE [FLAGS...]: one line of
# tandem-perplexity's JSON with the type, the --gguf_experts mode and the
# size of the weights file added.
measure() {
  local type=$1 mode=$2 file=$3 bytes
  bytes=$(stat -c %s "$4")
  shift 4
  "$bin/tandem-perplexity" --model "$file" --reference_model "$model" --text "$text" --context "$context" \
    --stride "$stride" --threads "$threads" "$@" |
    python3 -c 'import json, sys; j = json.loads(sys.stdin.read()); j.update(type=sys.argv[1], gguf_experts=sys.argv[2], file_bytes=int(sys.argv[3])); print(json.dumps(j))' \
      "$type" "$mode" "$bytes" >>"$out"
}

measure bf16 folder "$model" "$model/model.safetensors"
for type in $types; do
  file=$gguf_dir/$type.gguf
  "$bin/tandem-quantize" --model "$model" --type "$type" --out "$file" --threads "$threads" >&2
  for mode in $modes; do
    measure "$type" "$mode" "$file" "$file" --gguf_experts "$mode" --gguf_dense "$mode"
  done
done
echo "wrote $out" >&2
table "$out"
