#!/usr/bin/env bash
# CPU decode at real model sizes: fastllm vs llama.cpp on the same random-weight GGUFs of real
# shapes, 1 and 2 threads, interleaved rounds (this VM's timings drift between rounds); then 8
# sequences decoded together (fastllm bench --batch vs llama-batched-bench S_TG) and peak RSS.
# Prints one line per measurement; a tg line also gives each side's weight stream in GB/s (file
# bytes x tok/s: the bytes a decode step reads, the tied embedding being the LM head).
#   bash scripts/bench-cpu-decode.sh MODELS_DIR [ROUNDS] [tg]     (tg: only the tg64 lines)
# MODELS_DIR holds llama-3.2-1b-q4_0.gguf, llama-3.2-1b-q8_0.gguf and qwen2.5-0.5b-q4_0.gguf, written by
#   ../shared/peers/random-gguf.py MODELS_DIR/llama-3.2-1b-q4_0.gguf --shape llama-3.2-1b --dtype q4_0   (etc.)
# and, if present, llama-3.2-1b-q4_k_m.gguf (the Q8_0 file requantized by llama-quantize Q4_K_M).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:?usage: bench-cpu-decode.sh MODELS_DIR [ROUNDS]}
ROUNDS=${2:-3}
ONLY=${3:-}
cargo build --release -q -p fastllm-cli
F=./target/release/fastllm
PEER=../shared/peers/llama-cpp.sh
tok_s() { grep -E '[|] *(tg|pp)[0-9]' | awk -F'|' '{print $(NF-1)}' | sed 's/±.*//' | tr -d ' '; }
MODELS="llama-3.2-1b-q4_0 llama-3.2-1b-q8_0 qwen2.5-0.5b-q4_0"
[[ -f $DIR/llama-3.2-1b-q4_k_m.gguf ]] && MODELS="llama-3.2-1b-q4_k_m $MODELS"
for m in $MODELS; do
  $F info "$DIR/$m.gguf" >/dev/null   # converts once, outside the timings
done
gbs() { awk -v b="$1" -v t="$2" 'BEGIN { printf "%.1f", b * t / 1e9 }'; }
for r in $(seq 1 "$ROUNDS"); do
  for m in $MODELS; do
    bytes=$(stat -L -c %s "$DIR/$m.gguf")
    for t in 1 2; do
      a=$($F bench -m "$DIR/$m.gguf" -p 0 -n 64 -r 3 --threads $t | tok_s)
      b=$(bash $PEER bench -m "$DIR/$m.gguf" -p 0 -n 64 -r 3 -t $t -o md 2>/dev/null | tok_s)
      echo "round $r $m threads $t tg64 fastllm $a ($(gbs "$bytes" "$a") GB/s) llama.cpp $b ($(gbs "$bytes" "$b") GB/s)"
    done
  done
  [[ $ONLY == tg ]] && continue
  a=$($F bench -m "$DIR/llama-3.2-1b-q4_0.gguf" -p 512 -n 0 -r 2 --threads 2 | tok_s)
  b=$(bash $PEER bench -m "$DIR/llama-3.2-1b-q4_0.gguf" -p 512 -n 0 -r 2 -t 2 -o md 2>/dev/null | tok_s)
  echo "round $r llama-3.2-1b-q4_0 threads 2 pp512 fastllm $a llama.cpp $b"
  a=$($F bench -m "$DIR/llama-3.2-1b-q4_0.gguf" -p 16 -n 32 -r 1 --threads 2 --batch 8 | grep batch | awk -F'|' '{print $(NF-1)}' | tr -d ' ')
  b=$(bash $PEER batched -m "$DIR/llama-3.2-1b-q4_0.gguf" -t 2 -c 2048 -npp 16 -ntg 32 -npl 8 2>/dev/null | grep -E '^\|' | tail -1 | awk -F'|' '{print $9}' | tr -d ' ')
  echo "round $r llama-3.2-1b-q4_0 threads 2 8 sequences tg32 total fastllm $a llama.cpp S_TG $b"
done
[[ $ONLY == tg ]] && exit 0
rss() { /usr/bin/time -v "$@" 2>&1 >/dev/null | awk '/Maximum resident/ {printf "%.0f MiB", $6/1024}'; }
echo "peak RSS llama-3.2-1b-q4_0 tg16: fastllm $(rss $F bench -m "$DIR/llama-3.2-1b-q4_0.gguf" -p 0 -n 16 -r 1 --threads 2)" \
  "llama.cpp $(rss bash $PEER bench -m "$DIR/llama-3.2-1b-q4_0.gguf" -p 0 -n 16 -r 1 -t 2)"
