#!/bin/bash
# tandem against a llama.cpp-family engine's own llama-bench, on the same GGUF
# files, engines alternating file by file and round by round (A B, then B A)
# so a shared host's drift falls on both alike. Every JSON line is kept,
# tagged with engine, file type and round:
#   bench/vs_llama_bench.sh LLAMA_BENCH ROUNDS OUT.jsonl FILE.gguf...
# LLAMA_BENCH is the other engine's llama-bench, built by you out of tree
# (this repository holds no recipe for it); its flags are the ones its docs
# give for CPU MoE runs. Environment: THREADS (2), PROMPT (512), DECODE (64),
# REPS (2), LLAMA_FLAGS ("-fa 1 -rtr 1", ik_llama.cpp's; "" for llama.cpp),
# TANDEM_FLAGS (extra tandem-generate-bench flags, e.g. --max_isa avx2).
set -eu
llama_bench=${1:?usage: vs_llama_bench.sh LLAMA_BENCH ROUNDS OUT.jsonl FILE.gguf...}
rounds=${2:?} out=${3:?}
shift 3
here=$(cd "$(dirname "$0")/.." && pwd)
tandem_bench=${TANDEM_BENCH:-$here/build/bin/tandem-generate-bench}
threads=${THREADS:-2} prompt=${PROMPT:-512} decode=${DECODE:-64} reps=${REPS:-2}
llama_flags=${LLAMA_FLAGS--fa 1 -rtr 1}
tandem_flags=${TANDEM_FLAGS:-}
file_type() { basename "$1" .gguf | sed 's/.*-//'; }
run_llama() {
  # shellcheck disable=SC2086
  "$llama_bench" -m "$1" -t "$threads" -p "$prompt" -n "$decode" -r "$reps" $llama_flags -o json 2>/dev/null |
    python3 -c 'import json,sys
for row in json.load(sys.stdin):
    row.update(engine="llama-bench", file_type=sys.argv[1], round=int(sys.argv[2]), flags=sys.argv[3])
    print(json.dumps(row))' "$(file_type "$1")" "$2" "$llama_flags" >> "$out"
}
run_tandem() {
  # shellcheck disable=SC2086
  "$tandem_bench" --model_dir "$1" --prompt_tokens "$prompt" --decode_tokens "$decode" --reps "$reps" \
    --threads "$threads" $tandem_flags 2>/dev/null | grep '^{' |
    sed "s/^{/{\"engine\":\"tandem\",\"file_type\":\"$(file_type "$1")\",\"round\":$2,/" >> "$out"
}
for round in $(seq 1 "$rounds"); do
  for file in "$@"; do
    if [ $((round % 2)) = 1 ]; then
      run_llama "$file" "$round"; run_tandem "$file" "$round"
    else
      run_tandem "$file" "$round"; run_llama "$file" "$round"
    fi
  done
done
python3 - "$out" <<'EOF'
import json, sys, collections
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')]
res = collections.defaultdict(list)
for r in rows:
    if r.get('engine') == 'llama-bench':
        res[(r['file_type'], 'prefill' if r['n_prompt'] else 'decode', 'other')].append(r['avg_ts'])
    elif r.get('bench') == 'generate':
        res[(r['file_type'], 'prefill', 'tandem')].append(r['prefill_tokens_per_s'])
        res[(r['file_type'], 'decode', 'tandem')].append(r['decode_tokens_per_s'])
for ft in sorted({k[0] for k in res}):
    for test in ('prefill', 'decode'):
        t, o = res[(ft, test, 'tandem')], res[(ft, test, 'other')]
        if t and o:
            ratios = [a / b for a, b in zip(t, o)]
            print(f"{ft:8} {test:7} tandem {min(t):7.1f}-{max(t):7.1f}  other {min(o):7.1f}-{max(o):7.1f}  "
                  f"tandem/other {min(ratios):.2f}-{max(ratios):.2f} tok/s")
EOF
