#!/usr/bin/env bash
# Fails when a SIMD intrinsic is compiled as an out-of-line call in the release library: an
# intrinsic whose CPU feature the calling kernel's `#[target_feature]` list lacks (for example an
# AVX-512DQ instruction in an AVX-512F kernel) is not inlined, and every use becomes a function
# call that passes vectors through memory. Feature detection (`_xgetbv`) is the one call allowed.
#   bash scripts/check-intrinsics.sh [LIBRARY]   (default target/release/libfastllm.so)
set -euo pipefail
cd "$(dirname "$0")/.."
LIB=${1:-target/release/libfastllm.so}
if ! command -v objdump >/dev/null; then
    echo "check-intrinsics: skipped (objdump not installed)"
    exit 0
fi
[ -f "$LIB" ] || { echo "check-intrinsics: $LIB not found (build with cargo build --release first)"; exit 1; }
calls=$(objdump -d --no-show-raw-insn -C "$LIB" | grep -E 'call +[0-9a-f]+ <core::core_arch::' \
    | grep -v '_xgetbv' | sed 's/.*<//; s/>$//' | sort | uniq -c || true)
if [ -n "$calls" ]; then
    echo "check-intrinsics: out-of-line intrinsic calls in $LIB (add the feature to the kernel's target_feature list or use an intrinsic of the enabled features):"
    echo "$calls"
    exit 1
fi
echo "check-intrinsics: no out-of-line intrinsic calls in $LIB"
