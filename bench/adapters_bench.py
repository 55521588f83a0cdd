#!/usr/bin/env python3
"""Issue 29's benchmark: 4 adapter variants of the default model under A/B traffic, abserve
against (a) the naive setup, 4 llama.cpp servers, one per merged fine-tune, and (b) one
llama.cpp server with the 4 adapters and per-request LoRA (xllamacpp, its `lora` field).

The adapters are random rank-8 GGUF LoRA files (scripts/test-lora.py, seeds 1-4) stored as F16,
the type llama.cpp's convert_lora_to_gguf.py writes by default (`--adapter-type f32` for the
tests' F32 files); the merged fine-tunes are the model with each adapter merged at scale 1 and
quantized back to Q4_1 (scripts/merge-lora.py). Traffic: 32 chat requests of 64 tokens (end
of generation ignored, temperature 0), a quarter per variant, interleaved, from 8 and then 16
closed-loop clients.
Measured per run: generated tokens/s of wall time and the peak summed PSS of the servers'
processes (resident memory, shared pages divided among their sharers). abserve and (b) run
2 threads (the machine's cores), the naive setup's 4 servers 1 each (2 each, 8 spinning threads
on 2 cores, was slower); 16 slots in all (naive: 4 slots each), 512 context tokens per slot,
flash attention on. abserve twice: `lanes`, four adapter lanes (one llama.cpp context per lane
on the shared weights, 64-token micro-batches), and `abserve`, one context whose adapter set
changes in turns (--adapter-turn as given in --abserve-args).

    .venv/bin/pip install xllamacpp==2026.10.11549 gguf==0.19.0
    .venv/bin/python bench/adapters_bench.py [--runs 3] [--adapter-type f16]
        [--only lanes,abserve,base,per-request,naive,lanes-base,one-adapter]

`base` is abserve with no adapter (default settings) under the same traffic: the memory goal's
"one model" measured under load, not idle. The ratio columns divide `--ours` (default lanes).
Two setups attribute the lanes' distance from `base`: `lanes-base`, the same four lanes with no
adapter (what dividing the slots between four contexts costs), and `one-adapter`, one context
with every request under the same adapter (what the adapter's own matmuls cost, no set change).
With no adapter, sequences fill a lane before the next: at 16 clients all four lanes decode, as
with four adapters; at 8, two lanes of four sequences instead of four of two.
"""
import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from before_after import ABSERVE, MODEL, PeakPss, chat, stop  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "models" / "test"
TOPICS = ["shipping", "returns", "refunds", "e-books", "gift cards", "loyalty points", "damaged books", "pre-orders"]


def assets(kind):
    loras, merged = [], []
    OUT.mkdir(parents=True, exist_ok=True)
    tag = "" if kind == "f32" else f"-{kind}"
    for seed in range(1, 5):
        lora = OUT / f"lora-r8{tag}-seed{seed}.gguf"
        if not lora.exists():
            subprocess.run([sys.executable, str(ROOT / "scripts/test-lora.py"), str(MODEL), str(lora), "--seed", str(seed),
                            "--type", kind], check=True)
        m = OUT / f"merged-r8{tag}-seed{seed}.gguf"
        if not m.exists():
            subprocess.run([sys.executable, str(ROOT / "scripts/merge-lora.py"), str(MODEL), str(lora), str(m)], check=True)
        loras.append(lora.resolve())
        merged.append(m.resolve())
    return loras, merged


def workload(n=32):
    """(variant, body) pairs: a quarter per variant, interleaved as A/B traffic arrives."""
    items = []
    for i in range(n):
        v = i % 4
        items.append((v, {"model": "m", "max_tokens": 64, "temperature": 0, "ignore_eos": True,
                          "messages": [{"role": "user", "content": f"Question {i}: tell me about {TOPICS[i % 8]}."}]}))
    random.Random(7).shuffle(items)
    return items


EXTRA = []


# abserve with adapter lanes: one context per adapter set on the shared weights, 64-token
# micro-batches so that four compute buffers cost little
LANES = ["--adapter-lanes", "4", "--batch", "64"]


def start_abserve(loras, lanes=()):
    args = [str(ABSERVE), "serve", "--model", str(MODEL), "--port", "0", "--threads", "2", "--model-id", "m",
            "--data-dir", tempfile.mkdtemp(prefix="abserve-bench-"), "--max-sequences", "16", "--context", "512",
            "--queue-timeout", "300", *EXTRA, *lanes]
    for l in loras:
        args += ["--lora", str(l)]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in p.stdout:
        if line.startswith("abserve: listening on "):
            return p, line.split()[-1]
    raise RuntimeError("abserve did not start")


PEER = """
import sys, xllamacpp as x
model, parallel, threads, loras = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
p = x.CommonParams(); p.model.path = model; p.n_parallel = parallel; p.n_ctx = parallel * 512
p.cpuparams.n_threads = threads; p.cpuparams_batch.n_threads = threads
p.flash_attn_type = x.llama_flash_attn_type.LLAMA_FLASH_ATTN_TYPE_ENABLED
p.lora_adapters = [x.CommonAdapterLoraInfo(l, 0.0) for l in loras]
s = x.Server(p); print("ADDR", s.listening_address, flush=True)
sys.stdin.read()
"""


def start_peer(model, parallel, threads, loras=()):
    p = subprocess.Popen([sys.executable, "-c", PEER, str(model), str(parallel), str(threads), *map(str, loras)],
                         stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in p.stdout:
        if line.startswith("ADDR "):
            return p, line.split()[1].rstrip("/")
    raise RuntimeError("xllamacpp did not start")


def set_changes(base):
    """abserve's count of contexts given another adapter set (/metrics), warm-up included."""
    text = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
    return sum(int(float(l.split()[-1])) for l in text.splitlines()
               if l.startswith("abserve_model_adapter_set_changes_total{"))


def run(setup, loras, merged, clients):
    """(tokens/s, peak PSS bytes) of one setup under the workload."""
    if setup in ("base", "lanes-base"):
        # one model, no adapter, under the same traffic: the fair "one model" for memory
        procs = [start_abserve([], LANES if setup == "lanes-base" else ())]
        route = lambda v, b: (procs[0][1], b)  # noqa: E731
    elif setup == "one-adapter":
        procs = [start_abserve(loras[:1])]
        route = lambda v, b: (procs[0][1], dict(b, adapters=[{"path": str(loras[0])}]))  # noqa: E731
    elif setup in ("abserve", "lanes"):
        procs = [start_abserve(loras, LANES if setup == "lanes" else ())]
        route = lambda v, b: (procs[0][1], dict(b, adapters=[{"path": str(loras[v])}]))  # noqa: E731
    elif setup == "per-request":
        procs = [start_peer(MODEL, 16, 2, loras)]
        route = lambda v, b: (procs[0][1], dict(b, lora=[{"id": v, "scale": 1.0}]))  # noqa: E731
    else:
        procs = [start_peer(m, 4, 1) for m in merged]
        route = lambda v, b: (procs[v][1], b)  # noqa: E731
    try:
        mem = PeakPss([p.pid for p, _ in procs])
        # warm: one request per variant
        for v in range(4):
            base, body = route(v, dict(workload()[0][1], max_tokens=4))
            assert chat(base, body)[3] == 200
        items = workload()
        t0 = time.perf_counter()
        with ThreadPoolExecutor(clients) as ex:
            rs = list(ex.map(lambda vb: chat(*route(*vb)), items))
        wall = time.perf_counter() - t0
        peak = mem.done()
        if setup in ("abserve", "lanes"):
            print(f"  {setup} {clients} clients: {set_changes(procs[0][1])} adapter set changes", file=sys.stderr)
    finally:
        for p, _ in procs:
            stop(p)
    assert all(r[3] == 200 for r in rs), [r[3] for r in rs]
    return sum(r[2] for r in rs) / wall, peak


def attribution(res):
    """Medians of same-run tok/s ratios: where the lanes' distance from one model goes."""
    steps = [("lanes-base", "base", "four lanes, no adapter ÷ one context, no adapter (the split)"),
             ("lanes", "lanes-base", "four lanes with adapters ÷ four lanes without (the adapters)"),
             ("one-adapter", "base", "one context under one adapter ÷ no adapter (the adapter's matmuls)"),
             ("naive", "base", "(a) four merged servers ÷ one context, no adapter")]
    for num, den, what in steps:
        for c in (8, 16):
            if (num, c) in res and (den, c) in res:
                r = [n[0] / d[0] for n, d in zip(res[(num, c)], res[(den, c)])]
                print(f"{c} clients: {what}: {statistics.median(r):.2f}x ({min(r):.2f}-{max(r):.2f})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--abserve-args", default="")
    ap.add_argument("--only", default="lanes,abserve,base,per-request,naive,lanes-base,one-adapter")
    ap.add_argument("--adapter-type", choices=["f16", "f32"], default="f16")
    ap.add_argument("--ours", default="lanes", help="the setup the ratio columns divide")
    a = ap.parse_args()
    EXTRA.extend(a.abserve_args.split())
    import xllamacpp
    loras, merged = assets(a.adapter_type)
    setups = a.only.split(",")
    res = {(s, c): [] for s in setups for c in (8, 16)}
    for r in range(a.runs):
        for c in (8, 16):
            for s in setups:
                res[(s, c)].append(run(s, loras, merged, c))
                tps, peak = res[(s, c)][-1]
                print(f"run {r} {s} {c} clients: {tps:.1f} tok/s, peak PSS {peak / 2**20:.0f} MiB", file=sys.stderr,
                      flush=True)
    # one model's resident memory: abserve's process with no adapter, idle after one request
    p, base = start_abserve([])
    chat(base, dict(workload()[0][1], max_tokens=4))
    one = PeakPss([p.pid])
    time.sleep(1)
    one_model = one.done()
    stop(p)
    print(f"xllamacpp {xllamacpp.__version__}; medians of {a.runs} runs; one model alone (abserve, no adapter): "
          f"{one_model / 2**20:.0f} MiB PSS\n")
    print("| setup | clients | tok/s | peak PSS | memory vs one model | abserve tok/s ÷ this |")
    print("|---|---:|---:|---:|---:|---:|")
    names = {"lanes": "abserve: one model, 4 adapters, 4 adapter lanes (--adapter-lanes 4 --batch 64)",
             "abserve": "abserve: one model, 4 adapters, sets in turns on one context",
             "per-request": "(b) llama.cpp server, 4 adapters, per-request `lora`",
             "naive": "(a) 4 llama.cpp servers, one per merged fine-tune",
             "base": "one model under the same load (abserve, no adapter)",
             "lanes-base": "attribution: abserve, 4 adapter lanes, no adapter",
             "one-adapter": "attribution: abserve, one context, every request under adapter 1"}
    for c in (8, 16):
        ours = res[(a.ours, c)]
        for s in setups:
            xs = res[(s, c)]
            ratios = [o[0] / x[0] for o, x in zip(ours, xs)]
            print(f"| {names[s]} | {c} | {statistics.median(x[0] for x in xs):.1f} | "
                  f"{statistics.median(x[1] for x in xs) / 2**20:.0f} MiB | "
                  f"{statistics.median(x[1] for x in xs) / one_model:.2f}x | "
                  f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) |")
    if "base" in setups:
        for s in [x for x in ("lanes", "abserve") if x in setups]:
            for c in (8, 16):
                r = [o[1] / b[1] for o, b in zip(res[(s, c)], res[("base", c)])]
                print(f"{c} clients: {s} with 4 adapters / one model under the same load, peak PSS: "
                      f"{statistics.median(r):.3f}x ({min(r):.3f}-{max(r):.3f})")
    attribution(res)
    print("\n" + json.dumps({f"{s}/{c}": v for (s, c), v in res.items()}))


if __name__ == "__main__":
    main()
