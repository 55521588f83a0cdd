#!/usr/bin/env python3
"""Protection (issue 43): llama.cpp's own server (xllamacpp, 4 slots of 512 tokens) offered twice
the requests it has slots for, alone and behind `abserve serve --upstream` (`--max-queue 0`:
what cannot start at once is refused with 429 + Retry-After, not queued).

Each run first measures the upstream at exactly its slots ("full": one client per slot, back to
back, straight to llama.cpp: nothing waits in a queue; its rate is the capacity C, its time to
first token the floor for any request joining a full batch), then, one after the other:
- idle: one streamed request at a time, straight to llama.cpp (the time to first token of an
  idle upstream);
- alone: Poisson arrivals at 2C straight to llama.cpp: 4 run, the others wait inside it
  (llama.cpp's `requests_deferred`, sampled every 50 ms);
- behind: the same arrivals (same seed) through abserve: what the upstream's slots hold is
  admitted, the rest gets 429 at once. Each arrival is one request asked once (a 429 is counted,
  not retried), so every arm sees the same offered load;
- capped: the same through an abserve that admits at most `--capped` (2) requests at once there
  (`max_concurrency`), fewer than its slots.

Printed: time to first token p50/p99 of answered requests, answered and refused per second,
llama.cpp's most deferred requests; medians of the runs with their min-max (JSON with --json).
Requests: 48 tokens each (`ignore_eos`), greedy, a one-line prompt.
Goal: admitted requests' p99 TTFT behind abserve <= 1.5x the idle upstream's.

    .venv/bin/python bench/protection.py [--runs 3] [--seconds 20]
"""
import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from before_after import chat, poisson, start_abserve, start_peer, stop  # noqa: E402

SLOTS, CTX = 4, 512


def body(i):
    return {"model": "llama", "max_tokens": 48, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"Tell me a short story about the number {i}."}]}


def deferred(url):
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("llamacpp:requests_deferred"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


class Sampler:
    """The most requests llama.cpp held deferred, sampled every 50 ms."""

    def __init__(self, url):
        self.url, self.peak, self.on = url, 0.0, True
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while self.on:
            self.peak = max(self.peak, deferred(self.url))
            time.sleep(0.05)

    def stop(self):
        self.on = False
        self.t.join()
        return self.peak


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def idle(url, n=30):
    ttfts = [chat(url, body(i), stream=True)[1] for i in range(n)]
    return {"p50_ms": pct(ttfts, 0.5) * 1e3, "p99_ms": pct(ttfts, 0.99) * 1e3}


def full(url, seconds):
    """One client per slot, back to back, straight to llama.cpp: the requests per second it
    sustains (its capacity) and the time to first token of a request joining a full batch (the
    floor any admission at full slots gets; nothing waits in a queue here)."""
    ttfts, stop_at = [], time.perf_counter() + seconds

    def client(c):
        i = c
        while time.perf_counter() < stop_at:
            _, ttft, _, status = chat(url, body(i), stream=True)
            if status == 200:
                ttfts.append(ttft)
            i += SLOTS

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(SLOTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"p50_ms": pct(ttfts, 0.5) * 1e3, "p99_ms": pct(ttfts, 0.99) * 1e3,
            "answered_per_s": len(ttfts) / (time.perf_counter() - t0)}


def offered(url, llama, rate, seconds, seed):
    """Poisson arrivals at `rate` per second for `seconds`, each one request asked once (a 429
    is counted, not retried): TTFT of the answered, answered and refused per second, and the
    most requests llama.cpp held deferred."""
    ttfts, refused, lock = [], 0, threading.Lock()

    def one(i):
        nonlocal refused
        _, ttft, _, status = chat(url, body(i), stream=True)
        with lock:
            if status == 200:
                ttfts.append(ttft)
            else:
                assert status == 429, status
                refused += 1

    sampler = Sampler(llama)
    i, t0 = poisson(rate, seconds, seed, one)
    took = time.perf_counter() - t0
    return {"p50_ms": pct(ttfts, 0.5) * 1e3, "p99_ms": pct(ttfts, 0.99) * 1e3,
            "answered_per_s": len(ttfts) / took, "refused_per_s": refused / took,
            "peak_deferred": sampler.stop(), "offered_per_s": i / seconds}


def summary(runs, key):
    xs = [r[key] for r in runs]
    return statistics.median(xs), min(xs), max(xs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--upstream-threads", type=int, default=1,
                    help="llama.cpp's compute threads (default 1: on a 2-vCPU host the other core is "
                         "left to abserve and the clients, as the upstream has its own machine in use)")
    ap.add_argument("--capped", type=int, default=2, help="max_concurrency of the 'capped' arm")
    ap.add_argument("--json")
    a = ap.parse_args()
    threads = a.upstream_threads
    llama, lurl = start_peer(SLOTS, CTX, [f"p.cpuparams.n_threads = {threads}",
                                          f"p.cpuparams_batch.n_threads = {threads}"])
    gw, gurl = start_abserve(["--upstream", f"llama={lurl}/v1", "--max-queue", "0"])
    # the same upstream admitting fewer requests than its slots (max_concurrency): the knob that
    # trades throughput for a shorter wait on the batch
    capped_file = Path(tempfile.mkdtemp(prefix="abserve-protection-")) / "u.toml"
    capped_file.write_text(f'[[upstream]]\nid = "llama"\nurl = "{lurl}/v1"\nmax_concurrency = {a.capped}\n')
    gw2, gurl2 = start_abserve(["--upstreams", str(capped_file), "--max-queue", "0"])
    try:
        chat(lurl, body(0), stream=True)  # warm both
        chat(gurl, body(0), stream=True)
        chat(gurl2, body(0), stream=True)
        arms = {"idle": [], "full": [], "alone": [], "behind": [], "capped": []}
        for r in range(a.runs):
            arms["full"].append(full(lurl, a.seconds / 2))
            rate = 2 * arms["full"][-1]["answered_per_s"]
            arms["idle"].append(idle(lurl))
            arms["alone"].append(offered(lurl, lurl, rate, a.seconds, r))
            arms["behind"].append(offered(gurl, lurl, rate, a.seconds, r))
            arms["capped"].append(offered(gurl2, lurl, rate, a.seconds, r))
            print(f"run {r + 1}: offered {rate:.2f}/s " + json.dumps({k: v[-1] for k, v in arms.items()}), flush=True)
    finally:
        stop(gw)
        stop(gw2)
        stop(llama)
    print(f"\n{'arm':<8} {'TTFT p50 ms':>20} {'TTFT p99 ms':>22} {'answered/s':>18} {'429/s':>16} {'deferred':>10}")
    for name, runs in arms.items():
        cols = []
        for key in ("p50_ms", "p99_ms", "answered_per_s", "refused_per_s", "peak_deferred"):
            if key not in runs[0]:
                cols.append("-")
                continue
            m, lo, hi = summary(runs, key)
            cols.append(f"{m:.1f} ({lo:.1f}-{hi:.1f})")
        print(f"{name:<8} " + " ".join(f"{c:>20}" for c in cols))
    ratio = [b["p99_ms"] / i["p99_ms"] for b, i in zip(arms["behind"], arms["idle"])]
    alone = [b["p99_ms"] / i["p99_ms"] for b, i in zip(arms["alone"], arms["idle"])]
    floor = [b["p99_ms"] / i["p99_ms"] for b, i in zip(arms["full"], arms["idle"])]
    print(f"llama.cpp at exactly its slots (no queue): p99 TTFT / idle p99: median "
          f"{statistics.median(floor):.2f} ({min(floor):.2f}-{max(floor):.2f})")
    capped = [b["p99_ms"] / i["p99_ms"] for b, i in zip(arms["capped"], arms["idle"])]
    print(f"behind abserve, max_concurrency {a.capped}: admitted p99 TTFT / idle p99: median "
          f"{statistics.median(capped):.2f} ({min(capped):.2f}-{max(capped):.2f})")
    print(f"\nbehind abserve: admitted p99 TTFT / idle p99: median {statistics.median(ratio):.2f} "
          f"({min(ratio):.2f}-{max(ratio):.2f}); goal <= 1.5")
    print(f"llama.cpp alone: p99 TTFT / idle p99: median {statistics.median(alone):.2f} "
          f"({min(alone):.2f}-{max(alone):.2f})")
    if a.json:
        Path(a.json).write_text(json.dumps(arms, indent=1))


if __name__ == "__main__":
    main()
