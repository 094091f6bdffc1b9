#!/bin/bash
# Interleaved serve measurement (docs/benchmarks.md, "Serving SmolLM2"): per round and config, start
# `fastllm serve` (SmolLM2, 2 threads, 256 MiB KV), run 1 then 8 concurrent streams of 64 tokens,
# stop it. Configs: BEFORE (another fastllm binary, e.g. main's), AFTER without and with the
# prefix cache. Prints one line per run with the load average.
# usage: scripts/bench-serve-rounds.sh ROUNDS BEFORE_BIN AFTER_BIN [MODEL]
set -u
rounds=${1:-3}; before=${2:?before binary}; after=${3:?after binary}
M=${4:-$HOME/.cache/fastllm/SmolLM2-135M-Instruct.flm}
P="Once upon a time, in a small village by the sea, there lived an old fisherman who"
port=18090
for r in $(seq 1 "$rounds"); do
  for cfg in before after-nocache after-cache; do
    case $cfg in
      before) bin=$before; extra=();;
      after-nocache) bin=$after; extra=(--prefix-caching false);;
      after-cache) bin=$after; extra=(--prefix-caching true);;
    esac
    port=$((port + 1))
    "$bin" serve -m "$M" --port $port --threads 2 --kv-cache-mb 256 "${extra[@]}" >/dev/null 2>&1 &
    pid=$!
    for _ in $(seq 1 100); do curl -sf http://127.0.0.1:$port/health >/dev/null && break; sleep 0.2; done
    for c in 1 8; do
      n=$([ $c = 1 ] && echo 4 || echo 16)
      out=$("$after" bench-serve --addr 127.0.0.1:$port -c $c --requests $n -n 64 --prompt "$P" 2>&1 | tr '\n' ' ')
      echo "round $r $cfg c=$c load=$(cut -d' ' -f1 /proc/loadavg): $out"
    done
    kill $pid; wait $pid 2>/dev/null
  done
done
