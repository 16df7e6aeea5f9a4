#!/usr/bin/env bash
# Builds everything and runs every test (GoogleTest under ctest). This is what
# CI runs (.ci/run), on a clean machine.
set -euo pipefail
cd "$(dirname "$0")/.."

deploy/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"
ctest --test-dir build --output-on-failure -j"$(nproc)"
