#!/bin/bash
# Greedy tokens and their log-probabilities, tandem against ggml
# (mixtral_ggml.cc) on the same GGUF files, and both against tandem's exact
# kernels (f32 activations on the dequantized weights: the model the file
# describes). One JSON line per file on stdout:
#   same_prefix  leading greedy tokens on which the two engines agree (of N)
#   max_dlogprob the largest |logprob difference| of the chosen token over
#                that common prefix (tandem default vs ggml, and each vs exact)
#   bench/ggml_reference/agree.sh MIXTRAL_GGML PROMPT.txt N FILE.gguf...
# The prompt is the text's first 400 bytes, tokenized by the file's own
# vocabulary (tandem-generate; ggml is given the same ids).
set -eu
ggml=${1:?usage: agree.sh MIXTRAL_GGML PROMPT.txt N FILE.gguf...}
text=$(head -c 400 "$2")
n=$3
shift 3
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for file in "$@"; do
  build/bin/tandem-generate --model "$file" --prompt "$text" -n "$n" --ignore_eos --json > "$tmp/tandem.json" 2>/dev/null
  ids=$(python3 -c "import json; print(','.join(map(str, json.load(open('$tmp/tandem.json'))['prompt_ids'])))")
  build/bin/tandem-generate --model "$file" --prompt_ids "$ids" -n "$n" --ignore_eos --json --kernel_plan exact \
    > "$tmp/exact.json" 2>/dev/null
  "$ggml" --model "$file" --prompt_ids "$ids" -n "$n" > "$tmp/ggml.json"
  python3 - "$tmp" "$file" <<'PY'
import json, os, sys
tmp, path = sys.argv[1], sys.argv[2]
def run(name):
    d = json.load(open(os.path.join(tmp, name)))
    if 'logprobs' in d and isinstance(d['logprobs'], list):
        return d['tokens'], d['logprobs']
    return [t['id'] for t in d['tokens']], [t['logprob'] for t in d['tokens']]
runs = {k: run(k + '.json') for k in ('tandem', 'exact', 'ggml')}
def compare(a, b):
    (ta, la), (tb, lb) = runs[a], runs[b]
    same = 0
    while same < min(len(ta), len(tb)) and ta[same] == tb[same]:
        same += 1
    dl = max((abs(x - y) for x, y in zip(la[:same], lb[:same])), default=0.0)
    return {'same_prefix': same, 'of': len(ta), 'max_dlogprob': round(dl, 5)}
print(json.dumps({'bench': 'ggml_agreement', 'file': os.path.basename(path),
                  'prompt_tokens': len(json.load(open(os.path.join(tmp, 'tandem.json')))['prompt_ids']),
                  'tandem_vs_ggml': compare('tandem', 'ggml'), 'tandem_vs_exact': compare('tandem', 'exact'),
                  'ggml_vs_exact': compare('ggml', 'exact'),
                  'load_avg_1m': os.getloadavg()[0]}))
PY
done
