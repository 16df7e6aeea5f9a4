#!/usr/bin/env bash
# The quick start: install dependencies, build, make the built-in demo model
# (random weights from a fixed seed, a tokenizer trained on the licence texts
# every Debian machine has), and generate text from it.
set -euo pipefail
cd "$(dirname "$0")/.."

deploy/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)" --target tandem-make-model tandem-generate
if [ ! -f models/demo/config.json ]; then
  build/bin/tandem-make-model --preset demo --out models/demo
fi
# Random weights: sampling (fixed seed) shows more of the machinery than greedy
# text, which a random model quickly turns into repetition. Extra arguments
# go to tandem-generate and override these.
build/bin/tandem-generate --model models/demo --prompt "The licensee may" -n 48 \
  --temperature 1.0 --top_p 0.95 --seed 1 "$@"
