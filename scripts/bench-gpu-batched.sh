#!/usr/bin/env bash
# GPU batched decode: fastllm vs llama.cpp on the same random GGUFs (F16, and Q4_0 made by
# `llama-quantize --pure`), total decode tok/s at B = 1 / 8 / 32 / 64 / 128
# (fastllm bench --batch B -p 16 -n 64 against llama-batched-bench -npp 16 -ntg 64, S_TG).
# Runs on a GPU machine with nvcc, cmake, ninja and PyTorch (for the GGUF's random numbers):
#   bash scripts/bench-gpu-batched.sh FASTLLM PEER_DIR [SHAPE...]
# FASTLLM: a fastllm binary built with the CUDA feature; PEER_DIR holds llama-cpp-cuda.sh,
# random-gguf.py and llama.cpp-src.tar.xz (`../shared/peers/llama-cpp-cuda.sh pack PEER_DIR`).
# SHAPE: random-gguf.py shapes (default llama-3-8b; e.g. llama-3-8b llama-3.2-1b).
# The GGUFs and the llama.cpp build go to /tmp (about 42 GB of disk for the 8B with fastllm's
# conversions).
set -uo pipefail
F=${1:?usage: bench-gpu-batched.sh FASTLLM PEER_DIR [SHAPE...]}
P=${2:?usage: bench-gpu-batched.sh FASTLLM PEER_DIR [SHAPE...]}
shift 2
SHAPES=("$@"); [ ${#SHAPES[@]} -gt 0 ] || SHAPES=(llama-3-8b)
export FASTLLM_CACHE_DIR=${FASTLLM_CACHE_DIR:-/tmp/flmcache}
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
( bash "$P/llama-cpp-cuda.sh" build "$P" > /tmp/llama-cuda-build.log 2>&1 ) &
build=$!
for _ in $(seq 120); do [ -d /tmp/llama-cuda/src/gguf-py ] && break; sleep 1; done
for s in "${SHAPES[@]}"; do
  [ -f /tmp/$s-f16.gguf ] || GGUF_PY=/tmp/llama-cuda/src/gguf-py python3 "$P/random-gguf.py" /tmp/$s-f16.gguf \
    --shape "$s" --dtype f16 > /tmp/random-gguf.log 2>&1 || { echo "random-gguf.py $s failed"; exit 1; }
done
wait $build || { tail -20 /tmp/llama-cuda-build.log; exit 1; }
echo "llama.cpp built, GGUFs written: $(( $(date +%s) - t0 )) s"
B=/tmp/llama-cuda/bin
export LD_LIBRARY_PATH=$B:${LD_LIBRARY_PATH:-}
for s in "${SHAPES[@]}"; do
  [ -f /tmp/$s-q4.gguf ] || "$B/llama-quantize" --pure /tmp/$s-f16.gguf /tmp/$s-q4.gguf Q4_0 > /tmp/quantize.log 2>&1
  for f in q4 f16; do
    m=/tmp/$s-$f.gguf
    "$B/llama-batched-bench" -m $m -ngl 99 -fa 1 -c 16384 -npp 16 -ntg 64 -npl 1,8,32,64,128 2>/dev/null |
      grep -E '^\| +16 ' | awk -F'|' -v f="$s $f" '{gsub(/ /,""); print "llama.cpp " f " B=" $4 " S_TG " $9}'
    for b in 8 32 64 128; do
      "$F" bench -m $m --device cuda --batch $b -p 16 -n 64 -r 1 --json 2>/dev/null | tail -1 |
        python3 -c 'import json,sys; j=json.load(sys.stdin); print("fastllm %s B=%d %.1f (b=1 tg64 %.1f)" % (sys.argv[1], j["batch"], j["batch_tg_tok_s"], j["tg_tok_s"]))' "$s $f"
    done
    echo "  $(( $(date +%s) - t0 )) s"
  done
done
