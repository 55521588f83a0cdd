#!/usr/bin/env python3
"""Time to first token of requests that repeat a ~400-token system prompt, one after another,
on one `abserve serve`: the first computes the prompt, the next ones take it from the prefix
cache (finished sequences' KV kept until the memory is needed). Medians over --runs fresh
servers.

    .venv/bin/python bench/prefix_cache_ttft.py [--runs 5]
"""
import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import before_after as b  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--runs", type=int, default=5)
a = ap.parse_args()
sysp = b.long_system_prompt()
cold, warm = [], []
for _ in range(a.runs):
    p, base = b.start_abserve(["--memory-budget", "1GiB", "--context", "1024", "--kv-cells", "16384"])
    t = [b.chat(base, {"model": "m", "max_tokens": 8, "temperature": 0,
                       "messages": [{"role": "system", "content": sysp}, {"role": "user", "content": q}]}, stream=True)[1]
         for q in b.QUESTIONS[:10]]
    b.stop(p)
    cold.append(t[0])
    warm.append(statistics.median(t[1:]))
print(f"| first request (prompt computed) | {statistics.median(cold):.3f} s |")
print(f"| next 9, same system prompt (median) | {statistics.median(warm):.3f} s |")
print(f"| ratio | {statistics.median(cold) / statistics.median(warm):.1f}x |")
