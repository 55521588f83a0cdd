#!/usr/bin/env python3
"""Diagnostic for docs/benchmarks.md (B): the workload of before_after.py part B at 8 clients,
against llama.cpp with and without cache_prompt, and against abserve in variant order and shuffled.
3 runs each, printed as lists.

    .venv/bin/python bench/prompt_cache_check.py
"""
import sys, time, statistics
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
import before_after as b
bs = b.bodies(8, 8, 64, "m")
peer_p, peer_base = b.start_peer(8, 512)
b.run_clients(peer_base, bs[:2], 2)
for cache in [True, False]:
    tps = []
    for _ in range(3):
        body = [dict(x, cache_prompt=cache) for x in bs]
        t0 = time.perf_counter(); r = b.run_clients(peer_base, body, 8); w = time.perf_counter() - t0
        tps.append(sum(x[2] for x in r) / w)
    print("llama.cpp cache_prompt", cache, [round(t, 1) for t in tps], flush=True)
b.stop(peer_p)
ours_p, ours_base = b.start_abserve(["--memory-budget", "1GiB", "--context", "512", "--max-sequences", "8"])
b.run_clients(ours_base, bs[:2], 2)
tps = []
for _ in range(3):
    t0 = time.perf_counter(); r = b.run_clients(ours_base, bs, 8); w = time.perf_counter() - t0
    tps.append(sum(x[2] for x in r) / w)
print("abserve", [round(t, 1) for t in tps])
# shuffled order: consecutive requests of a client rarely share a variant
import random
random.seed(1); sh = bs[:]; random.shuffle(sh)
tps = []
for _ in range(3):
    t0 = time.perf_counter(); r = b.run_clients(ours_base, sh, 8); w = time.perf_counter() - t0
    tps.append(sum(x[2] for x in r) / w)
print("abserve shuffled", [round(t, 1) for t in tps])
b.stop(ours_p)
