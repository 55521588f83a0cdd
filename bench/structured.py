#!/usr/bin/env python3
"""Structured outputs against llama.cpp's own server (issue 28's benchmark), over HTTP.

Real-world schemas from JSONSchemaBench (github.com/guidance-ai/jsonschemabench, data/): a fixed
sample of --per-dir schemas from each of Glaiveai2K, Github_easy, Github_medium, Kubernetes and
Snowplow (every k-th file in name order; schemas over 6000 characters of JSON are skipped so
prompts fit the context). Each is sent as OpenAI's `response_format: {"type": "json_schema"}`,
with the schema also in the prompt, temperature 0, max_tokens 256, 4 clients.

llama.cpp's server: xllamacpp (GBNF from the JSON schema), n_parallel 4, 4 x 4096 cells,
2 threads, flash attention on. abserve: `--max-sequences 4 --context 4096`, 2 threads.

Reported per server: schemas accepted (HTTP 200), finished answers (finish_reason stop) that
validate with Python's jsonschema (format checker on), finished answers that break their schema,
generated tokens/s of wall time (completion tokens / wall), and abserve's mask time per token
and forced-token share from its /metrics. Medians over --runs runs, each run measuring both
servers back to back on the same schemas.

    git clone https://github.com/guidance-ai/jsonschemabench /tmp/jsb   # or any copy of data/
    .venv/bin/python bench/structured.py --data /tmp/jsb/data [--runs 3] [--per-dir 8]
"""
import argparse
import json
import statistics
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema

sys.path.insert(0, str(Path(__file__).resolve().parent))
from before_after import start_abserve, start_peer, stop  # noqa: E402

DIRS = ["Glaiveai2K", "Github_easy", "Github_medium", "Kubernetes", "Snowplow"]


def sample(data, per_dir):
    out = []
    for d in DIRS:
        files = sorted((Path(data) / d).glob("*.json"))
        picked = []
        step = max(1, len(files) // (per_dir * 3))
        for f in files[::step]:
            text = f.read_text()
            if len(text) > 6000:
                continue
            try:
                schema = json.loads(text)
                jsonschema.validators.validator_for(schema).check_schema(schema)
            except Exception:
                continue
            picked.append((f"{d}/{f.name}", schema))
            if len(picked) == per_dir:
                break
        out.extend(picked)
    return out


def ask(base, name, schema):
    body = {
        "model": "m", "temperature": 0, "max_tokens": 256,
        "messages": [
            {"role": "system", "content": "You answer with JSON that matches the given schema."},
            {"role": "user", "content": "Give an example object for this JSON schema:\n" + json.dumps(schema)},
        ],
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
    }
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            v = json.loads(r.read())
        c = v["choices"][0]
        return 200, c["finish_reason"], c["message"]["content"], v["usage"]["completion_tokens"]
    except urllib.error.HTTPError as e:
        return e.code, None, e.read().decode()[:200], 0


def valid(schema, text):
    try:
        value = json.loads(text)
    except Exception:
        return False
    v = jsonschema.validators.validator_for(schema)(schema, format_checker=jsonschema.FormatChecker())
    return v.is_valid(value)


def metrics(base):
    try:
        with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
            text = r.read().decode()
    except Exception:
        return {}
    out = {}
    for line in text.splitlines():
        if line.startswith("abserve_") and " " in line and "{" not in line:
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def measure(base, schemas, clients=4):
    before = metrics(base)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as ex:
        rs = list(ex.map(lambda s: ask(base, *s), schemas))
    wall = time.perf_counter() - t0
    after = metrics(base)
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    accepted = sum(1 for r in rs if r[0] == 200)
    finished = [(s, r) for s, r in zip(schemas, rs) if r[0] == 200 and r[1] == "stop"]
    ok = sum(1 for (_, schema), r in finished if valid(schema, r[2]))
    tokens = sum(r[3] for r in rs)
    masks = d.get("abserve_grammar_masks_total", 0)
    constrained = d.get("abserve_constrained_tokens_total", 0)
    return {
        "accepted": accepted, "finished": len(finished), "valid": ok, "broken": len(finished) - ok,
        "tok_s": tokens / wall, "tokens": tokens,
        "mask_ms": 1e3 * d.get("abserve_grammar_mask_seconds_total", 0) / masks if masks else None,
        "forced_share": d.get("abserve_forced_tokens_total", 0) / constrained if constrained else None,
        "refused": [(n, r[2]) for (n, _), r in zip(schemas, rs) if r[0] != 200],
    }


def warm(base, schemas):
    with ThreadPoolExecutor(4) as ex:
        list(ex.map(lambda s: ask(base, *s), schemas[:4]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="JSONSchemaBench's data/ folder")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--per-dir", type=int, default=8)
    a = ap.parse_args()
    schemas = sample(a.data, a.per_dir)
    print(f"{len(schemas)} schemas: " + ", ".join(n for n, _ in schemas), flush=True)
    rows = {"abserve": [], "llama.cpp": []}
    for run in range(a.runs):
        for name in ["abserve", "llama.cpp"]:
            p, base = start_abserve(["--max-sequences", "4", "--context", "4096"]) if name == "abserve" else start_peer(4, 4096)
            try:
                warm(base, schemas)
                r = measure(base, schemas)
            finally:
                stop(p)
            rows[name].append(r)
            print(f"run {run + 1} {name}: " + json.dumps({k: v for k, v in r.items() if k != "refused"}), flush=True)
            for n, why in r["refused"]:
                print(f"  refused {n}: {why}", flush=True)
    med = lambda name, k: statistics.median(x[k] for x in rows[name])
    print("\nmedians:")
    for name in rows:
        print(f"  {name}: accepted {med(name, 'accepted')}, finished {med(name, 'finished')}, valid {med(name, 'valid')}, "
              f"broken {med(name, 'broken')}, {med(name, 'tok_s'):.1f} tok/s")
    ratios = [x["tok_s"] / y["tok_s"] for x, y in zip(rows["abserve"], rows["llama.cpp"])]
    print(f"  tok/s ratio abserve/llama.cpp per run: {', '.join(f'{r:.2f}' for r in ratios)} (median {statistics.median(ratios):.2f})")
    masks = [x["mask_ms"] for x in rows["abserve"] if x["mask_ms"] is not None]
    forced = [x["forced_share"] for x in rows["abserve"] if x["forced_share"] is not None]
    if masks:
        print(f"  abserve mask time per token: median {statistics.median(masks):.3f} ms; forced-token share {statistics.median(forced):.2f}")


if __name__ == "__main__":
    main()
