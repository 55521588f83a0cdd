#!/usr/bin/env python3
"""Engine benchmark: abserve's engine against llama.cpp's own server loop (xllamacpp), same
model, same thread count, measured in the same run.

- decode: N concurrent sequences (N = 1, 4, 8, 16), each a distinct ~20-token prompt and
  MAX_TOKENS generated tokens with end-of-generation ignored; aggregate generated tokens per
  second of wall time.
- prefill: one ~1000-token prompt, one output token; prompt tokens / time to first token.

Median of RUNS runs each, printed as a Markdown table with ratios (abserve / llama.cpp).

    .venv/bin/python bench/engine_bench.py [--runs 5] [--threads 2]
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import xllamacpp as xlc

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
ABSERVE = ROOT / "target" / "release" / "abserve"
MAX_TOKENS = 128
TOPICS = ["the sea", "a mountain", "bread", "a robot", "the moon", "a library", "winter", "a violin"]


def prompts(n):
    return [f"Tell me a long story about {TOPICS[i % 8]}, chapter {i + 1}:" for i in range(n)]


def long_prompt():
    return " ".join(f"Sentence {i} of a long document about shipping policies and delivery times." for i in range(80))


def abserve_run(ps, max_tokens, threads, ctx):
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for p in ps:
            f.write(json.dumps({"prompt": p, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}) + "\n")
        path = f.name
    out = subprocess.run(
        [str(ABSERVE), "generate", "--model", str(MODEL), "--prompts", path, "--json", "--threads", str(threads),
         "--context", str(ctx), "--memory-budget", "2GiB", "--kv-cells", str(max(ctx * len(ps), 2048)),
         "--max-sequences", str(max(len(ps), 1))],
        check=True, capture_output=True, text=True,
    )
    rows = [json.loads(l) for l in out.stdout.splitlines()]
    return rows[:-1], rows[-1]["summary"]


def peer_server(n_parallel, threads, ctx):
    p = xlc.CommonParams()
    p.model.path = str(MODEL)
    p.n_parallel = n_parallel
    p.n_ctx = ctx * n_parallel
    p.cpuparams.n_threads = threads
    p.cpuparams_batch.n_threads = threads
    p.flash_attn_type = xlc.llama_flash_attn_type.LLAMA_FLASH_ATTN_TYPE_ENABLED
    return xlc.Server(p)


def peer_run(server, ps, max_tokens):
    results = [None] * len(ps)

    def one(i):
        results[i] = server.handle_completions(
            {"prompt": ps[i], "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "cache_prompt": False}
        )

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(ps))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--concurrency", default="1,4,8,16")
    a = ap.parse_args()
    rows = []
    for n in [int(x) for x in a.concurrency.split(",")]:
        ps = prompts(n)
        ours, theirs = [], []
        server = peer_server(n, a.threads, 512)
        peer_run(server, ps[:1], 4)  # warm-up
        for _ in range(a.runs):
            outs, summary = abserve_run(ps, MAX_TOKENS, a.threads, 512)
            ours.append(sum(o["completion_tokens"] for o in outs) / summary["wall_seconds"])
            res, wall = peer_run(server, ps, MAX_TOKENS)
            theirs.append(sum(r["usage"]["completion_tokens"] for r in res) / wall)
        del server
        rows.append((f"decode, {n} concurrent (tok/s)", statistics.median(ours), statistics.median(theirs)))
        print(rows[-1], file=sys.stderr)
    lp = long_prompt()
    server = peer_server(1, a.threads, 2048)
    ours, theirs = [], []
    for _ in range(a.runs):
        outs, _ = abserve_run([lp], 1, a.threads, 2048)
        ours.append(outs[0]["prompt_tokens"] / (outs[0]["ttft_ms"] / 1e3))
        res, _ = peer_run(server, [lp], 1)
        theirs.append(res[0]["timings"]["prompt_per_second"])
    rows.append((f"prefill, {outs[0]['prompt_tokens']}-token prompt (tok/s)", statistics.median(ours), statistics.median(theirs)))
    print(f"| measure | abserve | llama.cpp (xllamacpp {xlc.__version__}) | ratio |")
    print("|---|---:|---:|---:|")
    for name, o, t in rows:
        print(f"| {name} | {o:.1f} | {t:.1f} | {o / t:.2f}× |")


if __name__ == "__main__":
    main()
