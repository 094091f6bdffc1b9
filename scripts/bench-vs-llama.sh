#!/usr/bin/env bash
# fastllm vs llama.cpp on the default model (SmolLM2-135M-Instruct Q4_1), same GGUF, same threads,
# interleaved rounds (this VM's timings drift between rounds). Needs ../shared/peers/llama-cpp.sh.
#   bash scripts/bench-vs-llama.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
cargo build --release -q -p fastllm-cli
G=$(./target/release/fastllm fetch)
PEER=../shared/peers/llama-cpp.sh
for r in $(seq 1 "$ROUNDS"); do
  for t in 1 2; do
    for p in fast exact; do
      ./target/release/fastllm bench -m "$G" -p 128 -n 128 -r 5 --threads $t --precision $p --json | sed "s/^/fastllm round=$r /"
    done
    bash $PEER bench -m "$G" -p 128 -n 128 -t $t -r 5 -o json 2>/dev/null \
      | python3 -c "import json,sys; [print('llama.cpp round=$r', json.dumps({'threads':x['n_threads'],'test':('pp' if x['n_prompt'] else 'tg'),'tok_s':x['avg_ts']})) for x in json.load(sys.stdin)]"
  done
done
