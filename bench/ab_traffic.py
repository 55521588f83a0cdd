#!/usr/bin/env python3
"""A/B traffic against llama.cpp's own server (issue 9's benchmark), over HTTP, closed loop.

llama.cpp's server: xllamacpp, n_parallel 8, 8 x 512 cells, 2 threads, flash attention on,
its default prompt cache (cache_prompt) on. abserve: the same 8 x 512 KV cells and 2 threads
(`--max-sequences 8 --context 512`; add --abserve-args to try other settings). Fresh servers
per run, both warmed with the same 8 requests (one per variant), `ignore_eos`, temperature 0.

  ab8:     8 variants with distinct ~150-token system prompts, 48 requests of 64 tokens, 8 clients
  ab16:    the same at 16 clients
  shared:  8 variants sharing one ~300-token system prompt (they differ in the user template),
           48 requests of 64 tokens, 16 clients

Reports generated tokens/s of wall time, p50/p99 latency, and the abserve/llama.cpp ratio;
medians over --runs runs, each run measuring both servers back to back.

    .venv/bin/python bench/ab_traffic.py [--runs 3] [--only ab8,ab16,shared] [--abserve-args "..."]
"""
import argparse
import random
import shlex
import statistics
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from before_after import chat, run_clients, start_abserve, start_peer, stop  # noqa: E402

TOPICS = ["shipping", "returns", "refunds", "e-books", "gift cards", "loyalty points", "damaged books", "pre-orders"]


def distinct_system(v):
    """~150 tokens, different from the first word on."""
    rules = " ".join(f"Rule {k} for {TOPICS[v]}: be precise about step {k} and mention the {TOPICS[(v + k) % 8]} policy."
                     for k in range(1, 8))
    return f"Variant {v}. You are the {TOPICS[v]} specialist of an online bookshop. {rules} Answer in style {v}."


def shared_system():
    """~300 tokens, the same for every variant."""
    lines = [f"Policy {i}: orders of type {i} ship within {i % 5 + 1} business days and can be returned within {30 + i} days."
             for i in range(12)]
    return "You are the support assistant of an online bookshop.\n" + "\n".join(lines)


def user_template(v, q):
    styles = ["Briefly", "In detail", "Politely", "As a list", "In one sentence", "With an example", "Formally", "Casually"]
    return f"{styles[v]}, answer question {q}: what should I know about {TOPICS[(v + q) % 8]}?"


def workload(kind, n=48, max_tokens=64):
    bodies = []
    for i in range(n):
        v, q = i % 8, i // 8
        if kind == "shared":
            msgs = [{"role": "system", "content": shared_system()}, {"role": "user", "content": user_template(v, q)}]
        else:
            msgs = [{"role": "system", "content": distinct_system(v)}, {"role": "user", "content": f"Question {q}: tell me about {TOPICS[q % 8]}."}]
        bodies.append({"model": "m", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "messages": msgs})
    # A/B traffic arrives interleaved, not grouped by variant
    random.Random(7).shuffle(bodies)
    return bodies


def warm(base, kind):
    ws = workload(kind, n=8, max_tokens=4)
    run_clients(base, ws, 8)


# what each server counts of a run (--profile): the work its engine did
COUNTERS = {
    "abserve": ["abserve_prompt_tokens_computed_total", "abserve_prompt_tokens_reused_total",
                "abserve_prefix_copies_total", "abserve_prefix_restores_total",
                "abserve_engine_step_seconds_count", "abserve_engine_step_seconds_sum"],
    "llama.cpp": ["llamacpp:prompt_tokens_total", "llamacpp:n_decode_total",
                  "llamacpp:prompt_seconds_total", "llamacpp:tokens_predicted_seconds_total"],
}


def scrape(base, names):
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        text = r.read().decode()
    out = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in out:
            out[parts[0]] = float(parts[1])
    return out


def measure(base, kind, clients, counters=None):
    bs = workload(kind)
    before = scrape(base, counters) if counters else {}
    t0 = time.perf_counter()
    rs = run_clients(base, bs, clients)
    wall = time.perf_counter() - t0
    assert all(r[3] == 200 for r in rs), [r[3] for r in rs]
    toks = sum(r[2] for r in rs)
    lats = sorted(r[0] for r in rs)
    if counters:
        after = scrape(base, counters)
        print("   " + ", ".join(f"{k.split('_total')[0]}={after[k] - before[k]:.3g}" for k in counters), file=sys.stderr)
    return toks / wall, statistics.median(lats), lats[int(0.99 * (len(lats) - 1))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", default="ab8,ab16,shared")
    ap.add_argument("--abserve-args", default="")
    ap.add_argument("--profile", action="store_true", help="print what each engine computed (from /metrics)")
    a = ap.parse_args()
    cases = {"ab8": ("ab", 8), "ab16": ("ab", 16), "shared": ("shared", 16)}
    extra = ["--max-sequences", "8", "--context", "512", "--queue-timeout", "300"] + shlex.split(a.abserve_args)
    results = {c: {"abserve": [], "llama.cpp": []} for c in a.only.split(",")}
    for run in range(a.runs):
        for case in results:
            kind, clients = cases[case]
            for name in ["abserve", "llama.cpp"]:
                p, base = start_abserve(extra) if name == "abserve" else start_peer(8, 512)
                try:
                    warm(base, kind)
                    r = measure(base, kind, clients, COUNTERS[name] if a.profile else None)
                finally:
                    stop(p)
                results[case][name].append(r)
                print(f"run {run} {case} {name}: {r[0]:.1f} tok/s, p50 {r[1]:.2f} s, p99 {r[2]:.2f} s", file=sys.stderr, flush=True)
    print(f"abserve flags: {' '.join(extra)}\n")
    print("| workload | clients | abserve tok/s | llama.cpp tok/s | ratio | abserve p50 / p99 | llama.cpp p50 / p99 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for case, r in results.items():
        kind, clients = cases[case]
        med = {n: [statistics.median(x[i] for x in r[n]) for i in range(3)] for n in r}
        ratio = statistics.median(x[0] / y[0] for x, y in zip(r["abserve"], r["llama.cpp"]))
        label = "8 variants, distinct ~150-token system prompts" if kind == "ab" else "8 variants, one shared ~300-token system prompt"
        print(f"| {label} | {clients} | {med['abserve'][0]:.1f} | {med['llama.cpp'][0]:.1f} | {ratio:.2f}x | "
              f"{med['abserve'][1]:.1f} s / {med['abserve'][2]:.1f} s | {med['llama.cpp'][1]:.1f} s / {med['llama.cpp'][2]:.1f} s |")


if __name__ == "__main__":
    main()
