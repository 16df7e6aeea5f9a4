#!/usr/bin/env bash
# The papers' evaluation scenarios under their own hardware profiles, every
# policy preset in each (issue 5). Writes one JSON line per (scenario,
# preset) to bench/results/sim-scenarios.jsonl and prints the markdown table
# of docs/BENCHMARKS.md, "Planner, policies and simulator".
#
#   bench/run_scenarios.sh [build/bin/tandem-sim]
#
# Scenarios (each paper's own grid):
#   fiddler-a  input {32,64,128,256} × output {64,128,256,512}, end-to-end
#              tokens/s (Fiddler ICLR 2025 §4, Fig. 4), both Fiddler machines
#   fiddler-b  prefill {512,1024,2048,4096}, TTFT (Fig. 5)
#   fiddler-c  beam width {4,8,12,16}, input 32, output 64 (Fig. 6)
#   collab     (N index, M way) = (slots / M, M) for M in {2,4,8} (Mixtral,
#              56 slots) and {4,8,16} (Phi-3.5-MoE, 125 slots) (Fig. 5/6);
#              input/output 128 (the paper does not state its lengths)
#   daop       expert cache ratio {25,37.5,50,62.5}% of the 256 experts on
#              the GPU, input/output 256 (DAOP §V, Fig. 9/10)
# Runs in about a minute on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
SIM=${1:-build/bin/tandem-sim}
OUT=bench/results/sim-scenarios.jsonl
PRESETS=fiddler,collab,daop,offload,llamacpp,ours
SEQUENCES=4
mkdir -p bench/results
: > "$OUT"

run() {  # scenario name, then tandem-sim flags
  local name=$1
  shift
  "$SIM" --presets "$PRESETS" --sequences "$SEQUENCES" --scenario "$name" "$@" | grep '"kind":"result"' >> "$OUT"
}

for env in fiddler-env1-quadro-rtx6000-xeon6126 fiddler-env2-rtx6000ada-xeon8480; do
  p=bench/profiles/$env.json
  for in in 32 64 128 256; do
    for out in 64 128 256 512; do
      run "fiddler-a/in${in}-out${out}" --profile "$p" --prompt "$in" --decode "$out"
    done
  done
  for in in 512 1024 2048 4096; do
    run "fiddler-b/prefill${in}" --profile "$p" --prompt "$in" --decode 1
  done
  for beams in 4 8 12 16; do
    run "fiddler-c/beam${beams}" --profile "$p" --prompt 32 --decode 64 --beams "$beams"
  done
done

for ways in 2 4 8; do
  run "collab/mixtral-($((56 / ways)),${ways})" --profile bench/profiles/collab-rtx4090-tr7960x-mixtral.json \
    --lru_ways "$ways" --prompt 128 --decode 128
done
for ways in 4 8 16; do
  run "collab/phi35moe-($((125 / ways)),${ways})" --profile bench/profiles/collab-rtx4090-tr7960x-phi35moe.json \
    --lru_ways "$ways" --prompt 128 --decode 128
done

for env in daop-a6000-i9-10980xe-mixtral daop-a100-xeon6326-mixtral; do
  for ecr in 25:64 37.5:96 50:128 62.5:160; do  # ratio %: slots of the 32 × 8 experts
    run "daop/ecr${ecr%%:*}" --profile "bench/profiles/$env.json" --slots "${ecr##*:}" --prompt 256 --decode 256
  done
done

python3 bench/scenario_table.py "$OUT"
