#!/usr/bin/env python3
"""Gateway overhead (issue 43): the same client calling a minimal OpenAI-compatible responder
directly, through `abserve serve --upstream`, and through LiteLLM's proxy, at 1, 16 and 64
concurrent streams; added time to first token and to the last one (p50, p99) against direct,
and the request rate each holds.

The responder (written here, as gateway benchmarks do) answers every streamed chat with the same
10 chunks (role, 8 words, usage) in one write, so what is measured is the gateway's own work.
Every arm runs in the same process tree on the same cores, one after the other, `--runs` times;
medians of the runs with their min–max are printed (and written with --json).

    .venv/bin/python bench/gateway.py [--litellm /path/to/venv/bin/litellm] [--runs 3] [--seconds 6]
"""
import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
BINARY = Path(os.environ.get("ABSERVE_BIN", ROOT / "target" / "release" / "abserve"))
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
WORDS = ["alpha", " beta", " gamma", " delta", " epsilon", " zeta", " eta", " theta"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sse_body():
    base = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    chunks = [dict(base, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])]
    for w in WORDS:
        chunks.append(dict(base, choices=[{"index": 0, "delta": {"content": w}, "finish_reason": None}]))
    chunks.append(dict(base, choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}]))
    chunks.append(dict(base, choices=[], usage={"prompt_tokens": 12, "completion_tokens": 8, "total_tokens": 20}))
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks).encode() + b"data: [DONE]\n\n"


RESPONDER = r'''
import asyncio, json, sys
BODY = %r
MODELS = json.dumps({"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "bench"}]}).encode()
async def handle(r, w):
    try:
        while True:
            head = await r.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path = lines[0].split(" ")[:2]
            n = 0
            for l in lines[1:]:
                if l.lower().startswith("content-length:"):
                    n = int(l.split(":", 1)[1])
            if n:
                await r.readexactly(n)
            if method == "POST" and path.endswith("/chat/completions"):
                body, ctype, status = BODY, b"text/event-stream", b"200 OK"
            elif path.endswith("/models"):
                body, ctype, status = MODELS, b"application/json", b"200 OK"
            else:
                body, ctype, status = b'{"error": {"message": "not here"}}', b"application/json", b"404 Not Found"
            w.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: " + ctype + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            await w.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        w.close()
async def main():
    s = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]), backlog=1024)
    print("ready", flush=True)
    await s.serve_forever()
asyncio.run(main())
'''


def start(args, ready, env=None):
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    for line in p.stdout:
        if ready(line):
            return p
    raise RuntimeError(f"{args[0]} did not start")


def wait_http(url, timeout=120):
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer")


async def one(client, url, model):
    t0 = time.perf_counter()
    ttft = None
    body = {"model": model, "stream": True, "messages": [{"role": "user", "content": "Say eight words."}],
            "max_tokens": 8, "stream_options": {"include_usage": True}}
    async with client.stream("POST", url + "/chat/completions", json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return None
        async for line in r.aiter_lines():
            if ttft is None and line.startswith("data: ") and '"content": "alpha"' in line.replace('":"', '": "'):
                ttft = time.perf_counter() - t0
    return ttft, time.perf_counter() - t0


async def load(url, model, concurrency, seconds):
    """`concurrency` streams back to back for `seconds`: latencies, completed and failed counts."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    out, errors = [], 0
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        for _ in range(concurrency):  # warm the connections
            await one(client, url, model)
        stop = time.perf_counter() + seconds

        async def worker():
            nonlocal errors
            while time.perf_counter() < stop:
                try:
                    r = await one(client, url, model)
                except httpx.HTTPError:
                    r = None
                if r is None or r[0] is None:
                    errors += 1
                else:
                    out.append(r)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        took = time.perf_counter() - t0
    return out, errors, len(out) / took


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--litellm", help="the litellm executable of a venv with litellm[proxy]")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=6)
    ap.add_argument("--json")
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="abserve-gw-")
    rport = free_port()
    responder = start([sys.executable, "-c", RESPONDER % sse_body(), str(rport)], lambda l: l.startswith("ready"))
    direct = f"http://127.0.0.1:{rport}/v1"
    conf = os.path.join(d, "u.toml")
    with open(conf, "w") as f:
        f.write(f'[[upstream]]\nid = "m"\nurl = "{direct}"\nmodel = "m"\nmax_concurrency = 256\n')
    aport = free_port()
    abserve = start([str(BINARY), "serve", "--model", str(MODEL), "--model-id", "local", "--port", str(aport),
                     "--threads", "1", "--memory-budget", "1GiB", "--context", "512", "--data-dir", d,
                     "--upstreams", conf], lambda l: l.startswith("abserve: listening"))
    arms = {"direct": (direct, "m"), "abserve": (f"http://127.0.0.1:{aport}/v1", "m")}
    procs = [responder, abserve]
    if a.litellm:
        lport = free_port()
        lconf = os.path.join(d, "litellm.yaml")
        with open(lconf, "w") as f:
            f.write(f"model_list:\n  - model_name: m\n    litellm_params:\n      model: openai/m\n"
                    f"      api_base: {direct}\n      api_key: none\n")
        env = dict(os.environ, LITELLM_LOG="ERROR")
        procs.append(subprocess.Popen([a.litellm, "--config", lconf, "--host", "127.0.0.1", "--port", str(lport),
                                       "--num_workers", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env))
        wait_http(f"http://127.0.0.1:{lport}/health/liveliness")
        arms["litellm"] = (f"http://127.0.0.1:{lport}/v1", "m")
    rows = {}
    try:
        for run in range(a.runs):
            for c in (1, 16, 64):
                for arm, (url, model) in arms.items():
                    lat, errors, rate = asyncio.run(load(url, model, c, a.seconds))
                    r = rows.setdefault((arm, c), {"ttft50": [], "ttft99": [], "last50": [], "last99": [], "rate": [], "errors": []})
                    r["ttft50"].append(pct([x[0] for x in lat], 0.5) * 1e3)
                    r["ttft99"].append(pct([x[0] for x in lat], 0.99) * 1e3)
                    r["last50"].append(pct([x[1] for x in lat], 0.5) * 1e3)
                    r["last99"].append(pct([x[1] for x in lat], 0.99) * 1e3)
                    r["rate"].append(rate)
                    r["errors"].append(errors)
                    print(f"run {run} c={c} {arm}: ttft p50 {r['ttft50'][-1]:.2f} ms p99 {r['ttft99'][-1]:.2f} ms, "
                          f"{rate:.0f} req/s, {errors} errors", flush=True)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
    med = lambda xs: statistics.median(xs)
    span = lambda xs: f"{min(xs):.2f}–{max(xs):.2f}"
    print("\n| streams | arm | TTFT p50 ms | TTFT p99 ms | last p50 ms | last p99 ms | added p50 (TTFT/last) | added p99 (TTFT/last) | req/s (× direct) | errors |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    summary = {}
    for c in (1, 16, 64):
        base = rows[("direct", c)]
        for arm in arms:
            r = rows[(arm, c)]
            added = [(med(r[k]) - med(base[k])) for k in ("ttft50", "last50", "ttft99", "last99")]
            ratio = med(r["rate"]) / med(base["rate"])
            summary[f"{arm}@{c}"] = {k: med(v) for k, v in r.items()} | {"rate_ratio": ratio}
            print(f"| {c} | {arm} | {med(r['ttft50']):.2f} ({span(r['ttft50'])}) | {med(r['ttft99']):.2f} ({span(r['ttft99'])}) "
                  f"| {med(r['last50']):.2f} | {med(r['last99']):.2f} | {added[0]:+.2f} / {added[1]:+.2f} | {added[2]:+.2f} / {added[3]:+.2f} "
                  f"| {med(r['rate']):.0f} ({span(r['rate'])}; {ratio:.2f}×) | {sum(r['errors'])} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
