#!/usr/bin/env bash
# Installs tandem's build and run dependencies from Debian 12 packages only.
# Idempotent: packages already present are left alone. Needs root (or sudo).
#   deploy/install-deps.sh                  what builds and runs tandem
#   deploy/install-deps.sh --with-optional  also what only some tests need
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev
  libdnnl-dev
  libhwloc-dev hwloc libnuma-dev
  libsentencepiece-dev sentencepiece
  # the BPE tokenizers (common/tokenizer): Oniguruma runs the pre-tokenizer
  # regexes as Hugging Face's tokenizers does, ICU normalizes Unicode
  libonig-dev libicu-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libxxhash-dev
  # the HTTP server (Boost.Asio and Boost.Beast, header-only); cpp-httplib is the tests' client
  libboost1.81-dev libcpp-httplib-dev
  # the fuzzers and the sanitizer build (deploy/test.sh): clang with its libFuzzer and
  # sanitizer runtimes; lld links the programs and tests several times faster than GNU ld
  clang libclang-rt-dev lld
  python3 python3-grpcio python3-protobuf python3-jinja2
  # pip install ./client/python in a venv (tests/python_pip_install_test.cc)
  python3-venv
)

# node and npm run the tests' Node side (tests/node/): Hugging Face's
# tokenizers as the tokenizer oracle, the openai client, puppeteer-core.
# A nodejs that bundles its own npm (NodeSource's) conflicts with Debian's
# npm package, so npm is asked for only where no npm is on PATH.
packages+=(nodejs)
if ! command -v npm > /dev/null; then packages+=(npm); fi

# Optional (--with-optional): chromium for the web page test (headless,
# driven by puppeteer-core), which skips without it; deploy/test.sh (what
# CI runs) asks for it, so CI runs that test.
if [ "${1:-}" = "--with-optional" ]; then
  packages+=(chromium)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages already installed"
  exit 0
fi

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
