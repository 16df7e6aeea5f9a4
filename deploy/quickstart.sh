#!/usr/bin/env bash
# The quick start: install dependencies, build tandem-generate, and generate
# text from the model shipped in deploy/demo/ (a tiny MoE trained on the
# licence texts every Debian machine has; deploy/demo/README.md says how it
# was made). Extra arguments go to tandem-generate and override the ones
# below, e.g. --temperature 0 (greedy), --seed 7, -n 200, --prompt "...".
# TANDEM_LOG_LEVEL=info shows the loading and kernel choices it keeps quiet.
set -euo pipefail
cd "$(dirname "$0")/.."

model=deploy/demo/tiny-licence-moe.gguf
if [ ! -f "$model" ]; then
  echo "quickstart.sh: $model is missing (it is committed: a checkout without it is incomplete)" >&2
  exit 1
fi
deploy/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)" --target tandem-generate
echo "tiny-licence-moe: a 2-layer, 8-expert Mixtral-style MoE (4.5 M parameters, Q8_0) trained for 24 minutes on one core on the licence texts in /usr/share/common-licenses; expect licence-like prose, not answers."
TANDEM_LOG_LEVEL=${TANDEM_LOG_LEVEL:-warning} build/bin/tandem-generate --model "$model" \
  --prompt "The licensee may" -n 64 --temperature 0.8 --seed 1 "$@"
echo
