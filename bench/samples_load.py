#!/usr/bin/env python3
"""Sampled conversations under load (issue 45): what keeping every conversation costs.

The same server, twice per run, in alternating order: an experiment of two variants without
samples (off) and with `[experiment.samples] rate = 1.0` and a redaction pattern (on). Each arm:
`abserve loadtest --experiment load --concurrency C --duration S --assert-no-oom` (a fresh unit per
request, so every request of the `on` arm is sampled). Reported per arm: generated tokens/s,
requests/s, the server's peak resident memory, and for `on` the samples written and dropped
(`abserve_samples_total`) and the rows in the store. Medians of the runs (min–max); the ratio
on / off within each run.

Goals (issue 45): on ≥ 0.95× off throughput; memory bounded (peak RSS on ≈ off: the queue is
bounded; drops counted).

    .venv/bin/python bench/samples_load.py [--runs 3] [--seconds 30] [--concurrency 16]
"""
import argparse
import json
import re
import sqlite3
import statistics
import subprocess
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ABSERVE = ROOT / "target" / "release" / "abserve"
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
EXPERIMENT = """
[[experiment]]
name = "load"
{samples}
[[experiment.variants]]
id = "a"
system = "Be brief."
[[experiment.variants]]
id = "b"
system = "Be warm."
"""
SAMPLES = "[experiment.samples]\nrate = 1.0\nredact = ['ACCT-\\\\d+']\n"


def start(data, exp, slots):
    p = subprocess.Popen([str(ABSERVE), "serve", "--model", str(MODEL), "--port", "0", "--threads", "2",
                          "--model-id", "m", "--data-dir", data, "--experiments", exp,
                          "--max-sequences", str(slots)],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in p.stdout:
        m = re.match(r"abserve: listening on (http://\S+)", line)
        if m:
            return p, m.group(1)
    raise RuntimeError("abserve did not start")


def samples_metric(base):
    text = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
    return {m.group(1): int(float(m.group(2)))
            for m in re.finditer(r'^abserve_samples_total\{outcome="(\w+)"\} (\S+)', text, re.M)}


def arm(on, seconds, concurrency):
    d = tempfile.mkdtemp(prefix="abserve-bench-samples-")
    exp = Path(d) / "experiments.toml"
    exp.write_text(EXPERIMENT.format(samples=SAMPLES if on else ""))
    p, base = start(d, str(exp), concurrency)
    try:
        r = subprocess.run([str(ABSERVE), "loadtest", "--url", base, "--experiment", "load",
                            "--concurrency", str(concurrency), "--duration", str(seconds),
                            "--max-tokens", "uniform:32-64", "--prompt-tokens", "uniform:32-128",
                            "--assert-no-oom", "--json"], capture_output=True, text=True, timeout=seconds + 300)
        assert r.returncode == 0, r.stderr[-2000:]
        rep = json.loads(r.stdout)
        out = {"tokens_per_s": rep["generated_tokens_per_second"], "requests_per_s": rep["requests_per_second"],
               "peak_rss": rep["memory"]["peak_rss_server_bytes"] or rep["memory"]["peak_rss_bytes"],
               "sent": rep["sent"]}
        if on:
            out["samples"] = samples_metric(base)
    finally:
        p.terminate()
        p.wait(60)
    if on:
        db = sqlite3.connect(str(Path(d) / "abserve.db"))
        out["rows"] = db.execute("SELECT COUNT(*) FROM samples").fetchone()[0]
        db.close()
    return out


def med(xs):
    return f"{statistics.median(xs):.3g} ({min(xs):.3g}–{max(xs):.3g})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--concurrency", type=int, default=16)
    a = ap.parse_args()
    runs = []
    for i in range(a.runs):
        order = [False, True] if i % 2 == 0 else [True, False]
        res = {on: arm(on, a.seconds, a.concurrency) for on in order}
        runs.append(res)
        print(json.dumps({"run": i, "off": res[False], "on": res[True]}), flush=True)
    off = [r[False] for r in runs]
    on = [r[True] for r in runs]
    ratio = [r[True]["tokens_per_s"] / r[False]["tokens_per_s"] for r in runs]
    rss = [r[True]["peak_rss"] / r[False]["peak_rss"] for r in runs]
    print(f"tokens/s off {med([x['tokens_per_s'] for x in off])}, on {med([x['tokens_per_s'] for x in on])}; "
          f"on/off {med(ratio)} (goal ≥ 0.95)")
    print(f"peak RSS MiB off {med([x['peak_rss'] / 2**20 for x in off])}, on {med([x['peak_rss'] / 2**20 for x in on])}; "
          f"on/off {med(rss)}")
    print("samples on: " + "; ".join(f"sent {x['sent']}, written {x['samples'].get('written')}, "
                                     f"queue_full {x['samples'].get('queue_full')}, rows {x['rows']}" for x in on))


if __name__ == "__main__":
    main()
