#!/usr/bin/env bash
# Batched decode on one GPU with two `fastllm` binaries, interleaved (old, new per row): total
# decode tok/s of `bench --synthetic llama-3-8b --batch B -p 16 -n 64` for Q4_0 (int4) and Q8_0
# (int8), then, when test binaries are given, runs them, and when one of them is cuda_batched,
# its ignored per-product timings (llama-3-8b shapes, every batched path).
#
#   scripts/gpu-batched-compare.sh OLD_FASTLLM NEW_FASTLLM [TEST_BINARY ...]
#
# Env: BATCHES (default "2 8 32 64 128"), DTYPES (default "int4 int8").
set -uo pipefail
if [ $# -lt 2 ]; then
    sed -n '2,9p' "$0"
    exit 2
fi
old=$1
new=$2
shift 2
export FASTLLM_CACHE_DIR=${FASTLLM_CACHE_DIR:-/tmp/flmcache}
nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null
status=0
for t in "$@"; do
    echo "== $t"
    "$t" --test-threads=1 2>&1 | grep -E '^test .*FAILED|panicked|SKIPPED|test result' || status=1
    case "$t" in
    *cuda_batched*) "$t" --ignored --nocapture time_batched 2>&1 | grep PERF ;;
    esac
done
# batch_tg_tok_s of one `fastllm bench --json` run
tps() {
    "$1" bench --synthetic llama-3-8b --dtype "$2" --device cuda --batch "$3" -p 16 -n 64 -r 1 --json \
        2>>"${TMPDIR:-/tmp}/gpu-batched-compare.err" | tail -1 |
        python3 -c 'import json,sys; print("%.0f" % (json.loads(sys.stdin.read())["batch_tg_tok_s"] or 0))' ||
        echo 0
}
printf '%-6s %-5s %8s %8s %7s\n' dtype B old new new/old
for dt in ${DTYPES:-int4 int8}; do
    for b in ${BATCHES:-2 8 32 64 128}; do
        o=$(tps "$old" "$dt" "$b")
        n=$(tps "$new" "$dt" "$b")
        printf '%-6s %-5s %8s %8s %7s\n' "$dt" "$b" "$o" "$n" "$(python3 -c "print('%.2f' % ($n / max($o, 1)))")"
    done
done
exit $status
