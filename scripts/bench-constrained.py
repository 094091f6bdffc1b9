#!/usr/bin/env python3
"""Decode tokens/s of a running `fastllm serve` with and without constrained decoding.

Usage: scripts/bench-constrained.py [BASE_URL] [REPS]   (default http://127.0.0.1:8080, 4)

Each rep times a chat completion of 1 and of 129 tokens (greedy, `ignore_eos`), plain and with
a `response_format` JSON schema whose string field the answer fills, and prints the decode
rate (128 tokens over the difference of the two times); the first rep is a warm-up. Prints
the medians of both modes and the constrained rate's cost relative to the plain one.
"""
import json
import sys
import time
import urllib.request

BASE = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8080"
REPS = int(sys.argv[2]) if len(sys.argv) > 2 else 4
MSGS = [{"role": "user", "content": "Write a long story about a robot who learns to paint."}]
SCHEMA = {"type": "object", "properties": {"story": {"type": "string"}}, "required": ["story"]}
FORMAT = {"type": "json_schema", "json_schema": {"name": "story", "schema": SCHEMA}}


def timed(max_tokens: int, constrained: bool) -> tuple[float, int]:
    body = {"messages": MSGS, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    if constrained:
        body["response_format"] = FORMAT
    req = urllib.request.Request(
        BASE + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    t = time.time()
    v = json.load(urllib.request.urlopen(req))
    return time.time() - t, v["usage"]["completion_tokens"]


def main() -> None:
    rates: dict[str, list[float]] = {"plain": [], "constrained": []}
    for rep in range(REPS + 1):
        for mode in rates:
            (t1, n1), (t2, n2) = timed(1, mode == "constrained"), timed(129, mode == "constrained")
            rate = (n2 - n1) / (t2 - t1)
            print(f"rep {rep} {mode}: {n2} tokens, decode {rate:.1f} tok/s", flush=True)
            if rep > 0:
                rates[mode].append(rate)
    med = {m: sorted(v)[len(v) // 2] for m, v in rates.items()}
    cost = 100 * (1 - med["constrained"] / med["plain"])
    print(f"median decode: plain {med['plain']:.1f} tok/s, constrained {med['constrained']:.1f}"
          f" tok/s ({cost:+.1f} % cost)")


if __name__ == "__main__":
    main()
