#!/usr/bin/env bash
# `convert-weights --dtype q4_k_m` vs llama.cpp's `llama-quantize ... Q4_K_M` on the tiny test
# fixtures: each fixture is written as an f16 GGUF (scripts/hf-to-gguf-f16.py), both quantizers
# read that file, and `fastllm perplexity --precision exact` gives each result's mean KL to the
# f16 model over TEXT. Prints one table row per fixture, with the type counts of both files.
#   scripts/quantize-vs-llama-tiny.sh LLAMA_QUANTIZE TEXT [FIXTURE...]
# Needs target/release/{fastllm,convert-weights}, python3 with `gguf` and `numpy` ($PYTHON).
set -euo pipefail
[ $# -ge 2 ] || { sed -n 2,7p "$0"; exit 2; }
QUANTIZE=$1; TEXT=$2; shift 2
FIXTURES=${*:-llama mistral mixtral qwen2 qwen3 qwen3_moe phi3 gemma3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
B=$ROOT/target/release
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
types() { "$PY" -c 'import collections,gguf,sys
c=collections.Counter(t.tensor_type.name for t in gguf.GGUFReader(sys.argv[1]).tensors)
print(" ".join(f"{n} {k}" for k, n in sorted(c.items())))' "$1"; }
flm_types() { "$B/convert-weights" --info "$1" | awk '/ bytes @ / {c[toupper($2)]++}
  END {for (k in c) printf "%s %s\n", c[k], k}' | sort -k2 | awk '{printf "%s%s %s", s, $1, $2; s=" "}'; }
# tensors stored bit-identically (same dtype and checksum) in both .flm files
same() { diff <(blocks "$1") <(blocks "$2") | grep -c '^<' || true; }
blocks() { "$B/convert-weights" --info "$1" | awk '/ bytes @ / {print $1, $2, $NF}' | sort; }
kl() { "$B/fastllm" perplexity -m "$1" -f "$TEXT" -c 256 --threads 2 --precision exact \
  --no-progress --json --kl-divergence "$2" 2>/dev/null | "$PY" -c 'import json,sys
k = json.load(sys.stdin)["kl_divergence"]
print("%.3e ± %.1e, top-1 %.2f %%" % (k["mean_kld"], k["mean_kld_err"], 100 * k["same_top"]))'; }
echo "| fixture | fastllm q4_k_m: mean KL to f16 | llama-quantize Q4_K_M | fastllm file | llama.cpp file | tensors differing |"
echo "|---|---|---|---|---|---|"
for m in $FIXTURES; do
  "$PY" "$ROOT/scripts/hf-to-gguf-f16.py" "$ROOT/../shared/fixtures/tiny/$m" "$W/f16.gguf"
  "$QUANTIZE" "$W/f16.gguf" "$W/ll.gguf" Q4_K_M >/dev/null 2>&1
  "$B/convert-weights" "$W/f16.gguf" -o "$W/f16.flm" >/dev/null 2>&1
  "$B/convert-weights" "$W/f16.gguf" -o "$W/fl.flm" --dtype q4_k_m >/dev/null 2>&1
  "$B/convert-weights" "$W/ll.gguf" -o "$W/ll.flm" >/dev/null 2>&1
  "$B/fastllm" perplexity -m "$W/f16.flm" -f "$TEXT" -c 256 --threads 2 --precision exact \
    --no-progress --json --kl-divergence-base "$W/base.bin" --save >/dev/null 2>&1
  echo "| $m | $(kl "$W/fl.flm" "$W/base.bin") | $(kl "$W/ll.flm" "$W/base.bin") |" \
    "$(flm_types "$W/fl.flm") | $(types "$W/ll.gguf") | $(same "$W/fl.flm" "$W/ll.flm") |"
done
