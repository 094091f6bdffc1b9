#!/usr/bin/env bash
# Runs the GPU decode and prefill rows of docs/benchmarks.md with two `fastllm` binaries on the
# same GPU, interleaved (old, new, old, new), and prints each row's tok/s side by side; then,
# when test binaries are given, runs them (the CUDA tests of the new build).
#
#   scripts/gpu-compare.sh OLD_FASTLLM NEW_FASTLLM [TEST_BINARY ...]
#
# Build both binaries with `cargo build --release -p fastllm-cli` (e.g. the old one in a
# `git worktree` of the base commit), and the test binaries with
# `cargo test --release --no-run --test runtime_options --test cuda_decode ...` (the paths
# cargo prints). NVRTC and cuBLAS must be on LD_LIBRARY_PATH.
set -euo pipefail
if [ $# -lt 2 ]; then
    sed -n '2,11p' "$0"
    exit 2
fi
old=$1
new=$2
shift 2
rows=(
    "--synthetic llama-3-8b --dtype int4 -p 0 -n 64"
    "--synthetic llama-3-8b --dtype f16 -p 0 -n 64"
    "--synthetic llama-3-8b --dtype int8 -p 0 -n 64"
    "--synthetic llama-3-8b --dtype int4 -p 0 -n 64 --kv-capacity 4096"
    "--synthetic llama-3-8b --dtype int4 -d 1024 -n 64 --kv-capacity 4096"
    "--synthetic llama-3.2-1b --dtype int4 -p 512 -n 128"
    "--synthetic llama-3-8b --dtype f16 -p 2048 -n 0"
    "--synthetic llama-3.2-1b --dtype f16 -p 512 -n 0"
)
# "pp X tg Y" of one `fastllm bench --json` run (the prompt and decode tok/s it reports)
rates() {
    "$1" bench --device cuda --json -r 3 $2 2>/dev/null |
        python3 -c 'import json,sys
r = json.loads(sys.stdin.read().strip().splitlines()[-1])
print("pp %.0f tg %.1f" % (r["pp_tok_s"] or 0, r["tg_tok_s"] or 0))'
}
printf '%-72s %-40s %-40s\n' "row" "old (two runs)" "new (two runs)"
for args in "${rows[@]}"; do
    o1=$(rates "$old" "$args")
    n1=$(rates "$new" "$args")
    o2=$(rates "$old" "$args")
    n2=$(rates "$new" "$args")
    printf '%-72s %-40s %-40s\n' "$args" "$o1 | $o2" "$n1 | $n2"
done
status=0
for t in "$@"; do
    echo "== $t"
    "$t" --test-threads=1 2>&1 | grep -E '^test |SKIPPED|test result' || status=1
done
exit $status
