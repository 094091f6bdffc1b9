#!/usr/bin/env bash
# A/B of the serve throughput ratio (docs/benchmarks.md, "Serving SmolLM2"): per round, wait until
# both CPUs are >= 90 % idle for 3 s (other builds distort 2-thread numbers badly), then for
# BEFORE and AFTER: start `fastllm serve` (SmolLM2, 2 threads, 256 MiB KV), run 8 requests at
# one stream and 32 at eight streams (64 tokens each), stop it.
# usage: scripts/bench-serve-ab.sh BEFORE_BIN AFTER_BIN [ROUNDS] [MODEL]
set -u
before=${1:?before binary}; after=${2:?after binary}; rounds=${3:-4}
M=${4:-$HOME/.cache/fastllm/SmolLM2-135M-Instruct.flm}
P="Once upon a time, in a small village by the sea, there lived an old fisherman who"

idle_pct() {  # idle share of all CPUs over 3 s
  local a b c d
  read -r _ u n s i w q sq st _ < /proc/stat; a=$((u+n+s+i+w+q+sq+st)); b=$((i+w))
  sleep 3
  read -r _ u n s i w q sq st _ < /proc/stat; c=$((u+n+s+i+w+q+sq+st)); d=$((i+w))
  echo $(( 100*(d-b)/(c-a) ))
}

port=18200
for r in $(seq 1 "$rounds"); do
  waited=0
  while [ "$(idle_pct)" -lt 90 ] && [ $waited -lt 900 ]; do waited=$((waited + 3)); done
  for cfg in before after; do
    bin=$([ $cfg = before ] && echo "$before" || echo "$after")
    port=$((port + 1))
    "$bin" serve -m "$M" --port $port --threads 2 --kv-cache-mb 256 >/dev/null 2>&1 &
    pid=$!
    for _ in $(seq 1 100); do curl -sf http://127.0.0.1:$port/health >/dev/null && break; sleep 0.2; done
    for c in 1 8; do
      n=$([ $c = 1 ] && echo 8 || echo 32)
      out=$("$after" bench-serve --addr 127.0.0.1:$port -c $c --requests $n -n 64 --prompt "$P" 2>&1 | tr '\n' ' ')
      echo "round $r $cfg c=$c load=$(cut -d' ' -f1 /proc/loadavg): $out"
    done
    kill $pid; wait $pid 2>/dev/null
  done
done
