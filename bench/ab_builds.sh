#!/bin/bash
# Runs two builds of one benchmark alternating, A B then B A, so that a
# shared, noisy host's drift falls on both alike; every JSON line is kept,
# tagged with its build and round:
#   bench/ab_builds.sh OLD_BINARY NEW_BINARY ROUNDS OUT.jsonl ARGS...
# e.g. (a copy of each build's bench binary first):
#   bench/ab_builds.sh /tmp/gen-old /tmp/gen-new 4 ab.jsonl --model_dir m.gguf \
#     --prompt_tokens 512 --decode_tokens 16 --threads 2 --reps 2
#   bench/ab_builds.sh /tmp/ffn-old /tmp/ffn-new 2 ab.jsonl --dtype q4_K --rows 128 \
#     --compare_rows 1 --threads 2 --experts 2 --reps 5 --probe=false
set -eu
old=${1:?usage: ab_builds.sh OLD NEW ROUNDS OUT ARGS...} new=${2:?} rounds=${3:?} out=${4:?}
shift 4
for round in $(seq 1 "$rounds"); do
  order="old new"
  [ $((round % 2)) = 0 ] && order="new old"
  for build in $order; do
    binary=$old
    [ "$build" = new ] && binary=$new
    "$binary" "$@" 2>/dev/null | grep '^{' | sed "s/^{/{\"build\":\"$build\",\"round\":$round,/" >> "$out"
  done
done
echo "wrote $out"
