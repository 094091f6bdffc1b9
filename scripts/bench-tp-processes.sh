#!/usr/bin/env bash
# Tensor parallelism on a machine with 2 GPUs, each figure in the same run: llama-3-8b-shaped
# synthetic f16 weights on one GPU (TP=1), on two GPUs in one process (TP=2, rank threads) and
# on two GPUs as two processes (TP=2, --nnodes 2); decode at b=1, prefill 2048 and decode of 64
# sequences (REPS repetitions each, default 3). With a tiny .flm as second argument, also checks
# that two processes give the logits of one GPU.
#
# Usage: scripts/bench-tp-processes.sh [FASTLLM_BINARY] [TINY_FLM]
set -euo pipefail
F=${1:-fastllm}
TINY=${2:-}
PORT=${PORT:-29611}
REPS=${REPS:-3}

# NCCL: PyTorch's pip package ships libnccl.so.2; expose it as libnccl.so when none is installed
if ! ldconfig -p | grep -q 'libnccl.so '; then
  lib=$(find / -name 'libnccl.so.2' -not -path '/proc/*' 2>/dev/null | head -1 || true)
  if [ -n "$lib" ]; then
    mkdir -p /tmp/nccl && ln -sf "$lib" /tmp/nccl/libnccl.so
    export LD_LIBRARY_PATH=/tmp/nccl:${LD_LIBRARY_PATH:-}
  fi
fi

ARGS=(bench --synthetic llama-3-8b --dtype f16 -p 2048 -n 128 --batch 64 -r "$REPS" --json)
json() { python3 -c 'import json,sys
d=json.loads(sys.stdin.read().strip().splitlines()[-1])
print("%-28s tg %7.1f  pp2048 %8.1f  b64 %8.1f tok/s" % (sys.argv[1], d["tg_tok_s"], d["pp_tok_s"], d["batch_tg_tok_s"] or 0))' "$1"; }

"$F" "${ARGS[@]}" --device cuda:0 | json "TP=1 (cuda:0)"
"$F" "${ARGS[@]}" --device cuda:0,1 | json "TP=2, one process"
group=(--tp 2 --nnodes 2 --rendezvous "127.0.0.1:$PORT" --rendezvous-timeout 600)
"$F" "${ARGS[@]}" --device cuda:1 "${group[@]}" --node-rank 1 2>/tmp/node1.err &
"$F" "${ARGS[@]}" --device cuda:0 "${group[@]}" --node-rank 0 | json "TP=2, two processes"
wait || { echo "node 1 failed:"; cat /tmp/node1.err; exit 1; }

if [ -n "$TINY" ]; then
  L=(logits -m "$TINY" --ids 1,5,9,200,3,77 --top 5 --precision exact)
  "$F" "${L[@]}" --device cuda:0 >/tmp/tp1.json
  "$F" "${L[@]}" --device cuda:1 "${group[@]}" --node-rank 1 2>/tmp/node1.err &
  "$F" "${L[@]}" --device cuda:0 "${group[@]}" --node-rank 0 >/tmp/tp2.json
  wait
  python3 - <<'EOF'
import json
a = json.load(open("/tmp/tp1.json"))["positions"]
b = json.load(open("/tmp/tp2.json"))["positions"]
worst = 0.0
for p, q in zip(a, b):
    assert p["top"][0][0] == q["top"][0][0], (p["top"], q["top"])
    da = {t[0]: t[1] for t in p["top"]}
    for t in q["top"]:
        if t[0] in da:
            worst = max(worst, abs(da[t[0]] - t[1]))
print(f"logits, two processes vs one GPU: same top-1 at {len(a)} positions, max |dlogit| {worst:.2e}")
EOF
fi
