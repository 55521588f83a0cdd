#!/usr/bin/env python3
"""Before/after benchmark of the problem statement, measured with the real default model.

  A. "before": the naive harness, one process per variant, each loading its own copy of the
     model (llama.cpp through xllamacpp, 1 thread each) and answering its 16 prompts, with mmap
     on (processes share the GGUF's page cache) and off (each holds its own copy, as each
     process does on a GPU). "after": the same 8 variants x 16 prompts sent at once to one
     `abserve serve`. Peak memory is the peak over time of the summed PSS of the processes
     (/proc/PID/smaps_rollup), wall time includes loading the model(s).
  B. abserve against llama.cpp's server (xllamacpp, 8 parallel slots) at 8 concurrent clients,
     and at 16 (2x overload): aggregate generated tokens/s, p99 latency, peak PSS.
  C. Fan-out with a shared ~400-token system prompt: 16 requests at once.

Medians of --runs runs (default 5), printed as Markdown tables.

    .venv/bin/python bench/before_after.py [--runs 5]
"""
import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
# ABSERVE_BIN: another build (scripts/gpu-check.sh passes its CUDA or Vulkan build)
ABSERVE = Path(os.environ.get("ABSERVE_BIN", ROOT / "target" / "release" / "abserve"))
# PEER_GPU_LAYERS: layers llama.cpp's server offloads (its GPU build; 0 on a CPU)
PEER_GPU_LAYERS = int(os.environ.get("PEER_GPU_LAYERS", "0"))
TOPICS = ["shipping", "returns", "refunds", "e-books", "gift cards", "loyalty points", "damaged books", "pre-orders"]
QUESTIONS = [f"Question {i}: tell me about {TOPICS[i % 8]} and what I should do next." for i in range(16)]


def system_prompt(v):
    return f"You are support assistant variant {v} of an online bookshop. Style {v}: answer about {TOPICS[v]} clearly."


def long_system_prompt():
    lines = [f"Policy {i}: orders of type {i} ship within {i % 5 + 1} business days and can be returned within {30 + i} days."
             for i in range(24)]
    return "You are the support assistant of an online bookshop.\n" + "\n".join(lines)


def pss_kb(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class PeakPss:
    """Samples the summed PSS of some processes every 50 ms and keeps the peak."""

    def __init__(self, pids):
        self.pids = list(pids)
        self.peak = 0
        self.stop = False
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.stop:
            self.peak = max(self.peak, sum(pss_kb(p) for p in self.pids))
            time.sleep(0.05)

    def done(self):
        self.stop = True
        self.t.join()
        return self.peak * 1024


def chat(base, body, stream=False):
    """One chat request; returns (latency s, ttft s, completion tokens, status)."""
    body = dict(body, stream=stream)
    if stream:
        body["stream_options"] = {"include_usage": True}
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    ttft, tokens = None, 0
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            if not stream:
                v = json.loads(r.read())
                tokens = v["usage"]["completion_tokens"]
            else:
                for raw in r:
                    line = raw.decode().strip()
                    if not line.startswith("data:") or line == "data: [DONE]":
                        continue
                    v = json.loads(line[5:])
                    if v.get("choices") and v["choices"][0].get("delta", {}).get("content") and ttft is None:
                        ttft = time.perf_counter() - t0
                    if v.get("usage"):
                        tokens = v["usage"]["completion_tokens"]
        status = 200
    except urllib.error.HTTPError as e:
        status = e.code
    lat = time.perf_counter() - t0
    return lat, ttft if ttft is not None else lat, tokens, status


def bodies(n_variants, n_prompts, max_tokens, model):
    return [{"model": model, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
             "messages": [{"role": "system", "content": system_prompt(v)}, {"role": "user", "content": QUESTIONS[q]}]}
            for v in range(n_variants) for q in range(n_prompts)]


def run_clients(base, bs, concurrency, stream=False):
    with ThreadPoolExecutor(max_workers=concurrency) as ex:
        return list(ex.map(lambda b: chat(base, b, stream), bs))


def p99(xs):
    xs = sorted(xs)
    pos = 0.99 * (len(xs) - 1)
    lo, hi = int(pos), min(int(pos) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


# ---- servers ---------------------------------------------------------------------------------

def start_abserve(extra):
    p = subprocess.Popen([str(ABSERVE), "serve", "--model", str(MODEL), "--port", "0", "--threads", "2",
                          "--model-id", "m", "--data-dir", tempfile.mkdtemp(prefix="abserve-bench-")] + extra,
                         stdout=subprocess.PIPE, text=True,
                         # BENCH_SERVER_LOG: a file for the server's log (else it is dropped)
                         stderr=open(os.environ["BENCH_SERVER_LOG"], "a") if os.environ.get("BENCH_SERVER_LOG")
                         else subprocess.DEVNULL)
    for line in p.stdout:
        m = re.match(r"abserve: listening on (http://\S+)", line)
        if m:
            return p, m.group(1)
    raise RuntimeError("abserve did not start")


def start_peer(parallel, ctx_per_slot, settings=()):
    """llama.cpp's server (xllamacpp) in its own process; returns (process, base URL).
    `settings`: more Python lines run on its CommonParams `p` (module `x`) before it starts."""
    extra = "\n".join(settings)
    code = f"""
import sys, time, xllamacpp as x
p = x.CommonParams(); p.model.path = {str(MODEL)!r}; p.n_parallel = {parallel}; p.n_ctx = {parallel * ctx_per_slot}
p.cpuparams.n_threads = 2; p.cpuparams_batch.n_threads = 2; p.n_gpu_layers = {PEER_GPU_LAYERS}
p.flash_attn_type = x.llama_flash_attn_type.LLAMA_FLASH_ATTN_TYPE_ENABLED; p.endpoint_metrics = True
{extra}
s = x.Server(p); print("ADDR", s.listening_address, flush=True)
sys.stdin.read()
"""
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    for line in p.stdout:
        if line.startswith("ADDR "):
            return p, line.split()[1].rstrip("/")
    raise RuntimeError("xllamacpp did not start")


def poisson(rate, seconds, seed, one):
    """Calls `one(i)` on a thread of its own at Poisson arrivals of `rate` per second for
    `seconds` (seeded), then waits for every call; returns (arrivals, start time)."""
    rng = random.Random(seed)
    threads, t0, at, i = [], time.perf_counter(), 0.0, 0
    while True:
        at += rng.expovariate(rate)
        if at > seconds:
            break
        time.sleep(max(0.0, t0 + at - time.perf_counter()))
        t = threading.Thread(target=one, args=(i,))
        t.start()
        threads.append(t)
        i += 1
    for t in threads:
        t.join()
    return i, t0


def stop(p):
    p.terminate()
    try:
        p.wait(30)
    except subprocess.TimeoutExpired:
        p.kill()


# ---- A: naive harness vs abserve ----------------------------------------------------------------

WORKER = """
import json, sys, xllamacpp as x
v, mmap, max_tokens = int(sys.argv[1]), sys.argv[2] == "on", int(sys.argv[3])
p = x.CommonParams(); p.model.path = sys.argv[4]; p.n_parallel = 1; p.n_ctx = 512
p.cpuparams.n_threads = 1; p.cpuparams_batch.n_threads = 1
p.load_mode = x.llama_load_mode.LLAMA_LOAD_MODE_MMAP if mmap else x.llama_load_mode.LLAMA_LOAD_MODE_NONE
s = x.Server(p)
tokens = 0
for q in json.loads(sys.argv[5]):
    r = s.handle_chat_completions({"messages": [{"role": "system", "content": sys.argv[6]}, {"role": "user", "content": q}],
                                   "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True})
    tokens += r["usage"]["completion_tokens"]
print(json.dumps({"tokens": tokens}))
"""


def naive(mmap, max_tokens):
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(v), mmap, str(max_tokens), str(MODEL), json.dumps(QUESTIONS),
                               system_prompt(v)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for v in range(8)]
    mem = PeakPss([p.pid for p in procs])
    outs = [p.communicate()[0] for p in procs]
    wall = time.perf_counter() - t0
    peak = mem.done()
    tokens = sum(json.loads(o.strip().splitlines()[-1])["tokens"] for o in outs)
    return peak, wall, tokens


def after(max_tokens):
    t0 = time.perf_counter()
    # the same KV capacity as the 8 naive processes together (8 x 512 tokens)
    p, base = start_abserve(["--memory-budget", "1GiB", "--context", "512", "--kv-cells", "4096", "--max-queue", "256",
                             "--queue-timeout", "600"])
    mem = PeakPss([p.pid])
    res = run_clients(base, bodies(8, 16, max_tokens, "m"), 128)
    wall = time.perf_counter() - t0
    peak = mem.done()
    stop(p)
    assert all(r[3] == 200 for r in res), [r[3] for r in res]
    return peak, wall, sum(r[2] for r in res)


def median_of(runs, f):
    got = [f() for _ in range(runs)]
    return [statistics.median(x) for x in zip(*got)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--only", default="A,B,C")
    a = ap.parse_args()
    import xllamacpp
    out = [f"Machine: {os.cpu_count()} CPUs, {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB; "
           f"model {MODEL.name}; xllamacpp {xllamacpp.__version__}; medians of {a.runs} runs.\n"]
    mb = lambda b: f"{b / 1e6:.0f} MB"
    if "A" in a.only:
        rows = []
        for name, f in [("naive: 8 processes, mmap on", lambda: naive("on", a.max_tokens)),
                        ("naive: 8 processes, mmap off (as on a GPU)", lambda: naive("off", a.max_tokens)),
                        ("abserve: one server (same 4096 KV cells), 128 requests at once", lambda: after(a.max_tokens))]:
            peak, wall, tokens = median_of(a.runs, f)
            rows.append((name, peak, wall, tokens))
            print(name, peak, wall, tokens, file=sys.stderr)
        ab = rows[-1]
        out.append(f"### A. 8 variants x 16 prompts, {a.max_tokens} tokens each\n")
        out.append("| harness | peak memory (sum of PSS) | wall time (incl. loading) | tokens/s | memory vs abserve |")
        out.append("|---|---:|---:|---:|---:|")
        for name, peak, wall, tokens in rows:
            out.append(f"| {name} | {mb(peak)} | {wall:.1f} s | {tokens / wall:.1f} | {peak / ab[1]:.2f}x |")
        out.append("")
    if "B" in a.only:
        out.append("### B. abserve vs llama.cpp server (xllamacpp, 8 slots), 64 requests of 64 tokens\n")
        out.append("| clients | abserve tok/s | llama.cpp tok/s | ratio | abserve p99 latency | llama.cpp p99 latency | abserve 429s | abserve peak PSS | llama.cpp peak PSS |")
        out.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        bs = bodies(8, 8, 64, "m")
        ours_p, ours_base = start_abserve(["--memory-budget", "1GiB", "--context", "512", "--max-sequences", "8",
                                           "--queue-timeout", "30"])
        peer_p, peer_base = start_peer(8, 512)
        run_clients(ours_base, bs[:2], 2)
        run_clients(peer_base, bs[:2], 2)
        mem_o, mem_p = PeakPss([ours_p.pid]), PeakPss([peer_p.pid])
        for clients in [8, 16]:
            o_tps, p_tps, o_p99, p_p99, o_429 = [], [], [], [], []
            for _ in range(a.runs):
                t0 = time.perf_counter()
                r = run_clients(ours_base, bs, clients)
                w = time.perf_counter() - t0
                ok = [x for x in r if x[3] == 200]
                o_tps.append(sum(x[2] for x in ok) / w)
                o_p99.append(p99([x[0] for x in ok]))
                o_429.append(sum(1 for x in r if x[3] == 429))
                t0 = time.perf_counter()
                r = run_clients(peer_base, bs, clients)
                w = time.perf_counter() - t0
                p_tps.append(sum(x[2] for x in r) / w)
                p_p99.append(p99([x[0] for x in r]))
            m = statistics.median
            out.append(f"| {clients} | {m(o_tps):.1f} | {m(p_tps):.1f} | {m(o_tps) / m(p_tps):.2f}x | {m(o_p99):.1f} s | {m(p_p99):.1f} s | "
                       f"{m(o_429):.0f} | {mb(mem_o.peak * 1024)} | {mb(mem_p.peak * 1024)} |")
            print(out[-1], file=sys.stderr)
        mem_o.done(), mem_p.done()
        stop(ours_p), stop(peer_p)
        out.append("")
    if "C" in a.only:
        sysp = long_system_prompt()
        bs = [{"model": "m", "max_tokens": 32, "temperature": 0, "ignore_eos": True,
               "messages": [{"role": "system", "content": sysp}, {"role": "user", "content": q}]} for q in QUESTIONS]
        rows = []
        for name, start in [("abserve", lambda: start_abserve(["--memory-budget", "1GiB", "--context", "1024", "--kv-cells", "16384"])),
                            ("llama.cpp server (16 slots)", lambda: start_peer(16, 1024))]:
            walls, ttfts, pss = [], [], []
            for _ in range(a.runs):
                p, base = start()
                mem = PeakPss([p.pid])
                t0 = time.perf_counter()
                r = run_clients(base, bs, 16, stream=True)
                walls.append(time.perf_counter() - t0)
                ttfts.append(statistics.median(x[1] for x in r))
                pss.append(mem.done())
                stop(p)
            rows.append((name, statistics.median(walls), statistics.median(ttfts), statistics.median(pss)))
            print(rows[-1], file=sys.stderr)
        out.append("### C. Fan-out: 16 requests at once sharing a ~400-token system prompt, 32 tokens each\n")
        out.append("| server | wall time | TTFT p50 | peak PSS |")
        out.append("|---|---:|---:|---:|")
        for name, w, t, p in rows:
            out.append(f"| {name} | {w:.1f} s | {t:.2f} s | {mb(p)} |")
        out.append("")
    print("\n".join(out))


if __name__ == "__main__":
    main()
