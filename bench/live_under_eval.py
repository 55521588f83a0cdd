#!/usr/bin/env python3
"""Live under eval (issue 44): live chat traffic while an eval runs on the same model.

Live traffic: Poisson arrivals (`--rate`, default 1/s), each a streamed chat of 64 tokens
(`ignore_eos`, greedy), its time to first token measured. The eval: `--eval-clients` (24) clients
asking back to back, rows × 4 variants (each variant its own system prompt), 64 tokens each; its
throughput is the answers it completed per second during the live window. Both servers have 8
slots of 512 tokens and room to queue every client (`--max-queue 64`); nothing is refused.

Arms, in every run:
- a: abserve, live traffic alone;
- b: abserve, live + eval sent as `service_tier: "batch"` (priority classes on);
- c: abserve, live + eval sent as ordinary requests (all interactive: priorities off);
- d: llama.cpp's server (xllamacpp), live + eval as ordinary requests (it has no classes).

Goals: b's live p99 TTFT <= 1.3x a's; b's eval throughput >= 0.8x c's; b's live p99 <= 0.5x d's.

    .venv/bin/python bench/live_under_eval.py [--runs 3] [--seconds 30]
"""
import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from before_after import chat, poisson, start_abserve, start_peer, stop  # noqa: E402

SLOTS, CTX = 8, 512
VARIANTS = ["You are a helpful assistant.", "You are a terse assistant. Answer briefly.",
            "You are a friendly tutor who explains step by step.", "You answer like a pirate."]
TOPICS = ["rivers", "bread", "clocks", "bees", "volcanoes", "chess", "glass", "owls", "trains", "salt"]


def live_body(i, model):
    return {"model": model, "max_tokens": 64, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"Say something kind about visitor {i}."}]}


def eval_body(k, model, tier):
    row, v = divmod(k, len(VARIANTS))
    b = {"model": model, "max_tokens": 64, "temperature": 0, "ignore_eos": True,
         "messages": [{"role": "system", "content": VARIANTS[v]},
                      {"role": "user", "content": f"Row {row}: write two sentences about {TOPICS[row % len(TOPICS)]}."}]}
    if tier:
        b["service_tier"] = tier
    return b


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def arm(url, model, rate, seconds, seed, eval_clients, tier):
    """Live Poisson traffic for `seconds`, with `eval_clients` eval clients running from 3 s
    before it until it ends (none: live alone). Returns live TTFT p50/p99 and eval answers/s."""
    done_at, stop_eval = [], threading.Event()
    counter = iter(range(10 ** 9))
    lock = threading.Lock()

    def evaluator():
        while not stop_eval.is_set():
            with lock:
                k = next(counter)
            _, _, _, status = chat(url, eval_body(k, model, tier), stream=False)
            if status == 200:
                done_at.append(time.perf_counter())
            else:
                time.sleep(0.1)

    workers = [threading.Thread(target=evaluator, daemon=True) for _ in range(eval_clients)]
    for w in workers:
        w.start()
    if eval_clients:
        time.sleep(3)
    ttfts = []

    def one(i):
        _, ttft, _, status = chat(url, live_body(i, model), stream=True)
        assert status == 200, status
        ttfts.append(ttft)

    _, t0 = poisson(rate, seconds, seed, one)
    t1 = time.perf_counter()
    stop_eval.set()
    for w in workers:
        w.join()
    answered = sum(1 for d in done_at if t0 <= d <= t1)
    return {"live_p50_ms": pct(ttfts, 0.5) * 1e3, "live_p99_ms": pct(ttfts, 0.99) * 1e3,
            "live_n": len(ttfts), "eval_per_s": answered / (t1 - t0)}


def summary(runs, key):
    xs = [r[key] for r in runs]
    return statistics.median(xs), min(xs), max(xs)


def ratio(arms, x, kx, y, ky):
    rs = [a[kx] / b[ky] for a, b in zip(arms[x], arms[y])]
    return statistics.median(rs), min(rs), max(rs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--rate", type=float, default=1.0, help="live requests per second")
    ap.add_argument("--eval-clients", type=int, default=24)
    ap.add_argument("--json")
    a = ap.parse_args()
    sizes = ["--max-sequences", str(SLOTS), "--context", str(CTX), "--max-queue", "64"]
    ab, abu = start_abserve(sizes)
    llama, lu = start_peer(SLOTS, CTX)
    arms = {k: [] for k in "abcd"}
    try:
        chat(abu, live_body(0, "m"), stream=True)
        chat(lu, live_body(0, "llama"), stream=True)
        for r in range(a.runs):
            arms["a"].append(arm(abu, "m", a.rate, a.seconds, r, 0, None))
            arms["b"].append(arm(abu, "m", a.rate, a.seconds, r, a.eval_clients, "batch"))
            arms["c"].append(arm(abu, "m", a.rate, a.seconds, r, a.eval_clients, None))
            arms["d"].append(arm(lu, "llama", a.rate, a.seconds, r, a.eval_clients, None))
            print(f"run {r + 1}: " + json.dumps({k: v[-1] for k, v in arms.items()}), flush=True)
    finally:
        stop(ab)
        stop(llama)
    names = {"a": "abserve, live alone", "b": "abserve, + eval as batch", "c": "abserve, + eval, no classes",
             "d": "llama.cpp, + eval"}
    print(f"\n{'arm':<30} {'live TTFT p50 ms':>22} {'live TTFT p99 ms':>22} {'eval answers/s':>18}")
    for k, runs in arms.items():
        cols = []
        for key in ("live_p50_ms", "live_p99_ms", "eval_per_s"):
            m, lo, hi = summary(runs, key)
            cols.append(f"{m:.1f} ({lo:.1f}-{hi:.1f})" if k != "a" or key != "eval_per_s" else "-")
        print(f"{names[k]:<30} " + " ".join(f"{c:>22}" for c in cols))
    for label, args, goal in [
        ("b live p99 / a live p99", ("b", "live_p99_ms", "a", "live_p99_ms"), "<= 1.3"),
        ("b eval/s / c eval/s", ("b", "eval_per_s", "c", "eval_per_s"), ">= 0.8"),
        ("b live p99 / d live p99", ("b", "live_p99_ms", "d", "live_p99_ms"), "<= 0.5"),
        ("c live p99 / a live p99", ("c", "live_p99_ms", "a", "live_p99_ms"), "(no classes)"),
    ]:
        m, lo, hi = ratio(arms, *args)
        print(f"{label:<26} median {m:.2f} ({lo:.2f}-{hi:.2f})  goal {goal}")
    if a.json:
        Path(a.json).write_text(json.dumps(arms, indent=1))


if __name__ == "__main__":
    main()
