#!/usr/bin/env python3
"""Speculative decoding (issue 44): decode tokens/s with and without prompt-lookup drafts.

Workloads (greedy chat, the default model):
- extraction: a document of 12 records of five fields of 6 to 12 words (~1,100 tokens) and a
  request for one record's fields as JSON — answers copy spans of the prompt; `free`
  unconstrained, `json` with a JSON schema (`response_format`), 96 tokens at most (the default
  model, 135M parameters, copies the values poorly: its answers repeat keys and record names);
- copy: a completion that continues a copy of that document from a record's first words (96
  tokens) — what the model does copy, the ceiling of prompt lookup;
- ab: the A/B chat workload of bench/before_after.py (8 system prompts × questions), 64 tokens
  (`ignore_eos`).
At 1, 4 and 16 concurrent clients (3, 8 and 16 streamed requests per measurement), after one
warm-up request. Decode tokens/s: per stream, the tokens after the first over the time from its
first to its last token (prefill and queueing excluded), the mean over the streams × clients.

Engines, in every run: abserve `--speculative off`, abserve with its default (`on`: drafts where
they pay, measured), optionally `abserve draft` (`on` with `--draft-model $DRAFT_MODEL`; name it
in ENGINES=...), and llama.cpp's server (xllamacpp) without speculation and with each of
its n-gram types (`ngram-simple` as prompt lookup with n = 3 and 8 drafts, `ngram-simple` with
its defaults, `ngram-mod`); its best per cell is the peer. Both have 16 slots of 2,048 tokens.

Goals: abserve on ≥ 1.5× off single-stream on extraction; on ≥ 0.98× off everywhere; on ≥ 1.2×
llama.cpp's best on extraction; the ab workload ≥ 1.2× llama.cpp's server.

    .venv/bin/python bench/speculative.py [--runs 3] [--save runs.jsonl]
    .venv/bin/python bench/speculative.py --report runs.jsonl
"""
import argparse
import json
import os
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from before_after import QUESTIONS, start_abserve, start_peer, stop, system_prompt  # noqa: E402
import urllib.request  # noqa: E402

SLOTS, CTX = 16, 2048
CLIENTS = {1: 3, 4: 8, 16: 16}
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
         "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()
KEYS = ("name", "city", "team", "code", "note")
SCHEMA = {"type": "object", "properties": {k: {"type": "string"} for k in KEYS},
          "required": list(KEYS), "additionalProperties": False}


def document():
    r = random.Random(7)
    recs = []
    for i in range(12):
        # long values: an answer that copies them copies spans of 6 to 12 words
        f = {k: " ".join(r.choice(WORDS) for _ in range(r.randint(6, 12))) for k in KEYS}
        recs.append(f"Record {i}: " + "; ".join(f"{k}: {v}" for k, v in f.items()) + ".")
    return "\n".join(recs)


DOC = document()


def extraction(i, constrained, model):
    b = {"model": model, "max_tokens": 96, "temperature": 0,
         "messages": [{"role": "system", "content": "You copy fields out of documents exactly."},
                      {"role": "user", "content": f"{DOC}\n\nGive record {i % 12}'s fields as a JSON "
                                                  f"object with keys {', '.join(KEYS)}, copied exactly."}]}
    if constrained:
        b["response_format"] = {"type": "json_schema", "json_schema": {"name": "record", "schema": SCHEMA}}
    return b


def ab(i, model):
    return {"model": model, "max_tokens": 64, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "system", "content": system_prompt(i % 8)},
                         {"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]}


def copy(i, model):
    """A completion that continues a copy of the document from record i on (plain text)."""
    lines = DOC.split("\n")
    start = lines[i % 12]
    return {"model": model, "max_tokens": 96, "temperature": 0,
            "prompt": f"{DOC}\n\nThe same records again, copied exactly:\n{start[:40]}"}


WORKLOADS = {"extraction free": lambda i, m: extraction(i, False, m),
             "extraction json": lambda i, m: extraction(i, True, m),
             "copy": copy,
             "ab": ab}


def tokens_of(base, body):
    """One streamed request: (completion tokens, seconds from its first to its last token)."""
    path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
    body = dict(body, stream=True, stream_options={"include_usage": True})
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    first = last = None
    chunks, usage = 0, None
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            v = json.loads(line[5:])
            if v.get("usage"):
                usage = v["usage"]["completion_tokens"]
            c = (v.get("choices") or [{}])[0]
            if c.get("text") or (c.get("delta") or {}).get("content"):
                last = time.perf_counter()
                first = first or last
                chunks += 1
    return (usage if usage is not None else chunks), (last - first if first else 0.0)


def measure(base, model, work, clients, offset):
    """Decode tokens/s: per stream, tokens after the first over the time from first to last
    token (prefill excluded), summed over the concurrent streams (the mean × clients)."""
    n = CLIENTS[clients]
    bodies = [WORKLOADS[work](offset + i, model) for i in range(n)]
    with ThreadPoolExecutor(clients) as ex:
        got = list(ex.map(lambda b: tokens_of(base, b), bodies))
    toks = sum(t - 1 for t, d in got if d > 0)
    secs = sum(d for t, d in got if d > 0)
    return clients * toks / secs


def peer_settings(kind):
    s = [f"p.n_batch = 512"]
    if kind == "none":
        return s
    t = {"simple3": "NGRAM_SIMPLE", "simple": "NGRAM_SIMPLE", "mod": "NGRAM_MOD"}[kind]
    s.append(f"p.speculative.types = [x.common_speculative_type.COMMON_SPECULATIVE_TYPE_{t}]")
    if kind == "simple3":
        s += ["p.speculative.ngram_simple.size_n = 3", "p.speculative.ngram_simple.size_m = 8"]
    return s


ENGINES = ["abserve off", "abserve on", "llama none", "llama simple3", "llama simple", "llama mod"]
if os.environ.get("ENGINES"):
    ENGINES = os.environ["ENGINES"].split(",")


# `abserve draft`: on, with a draft model (default: the default model's first 15 of 30 layers,
# written by scripts/test-model-layers.py as the engine tests do)
DRAFT = os.environ.get("DRAFT_MODEL", str(Path(__file__).resolve().parent.parent / "models/test/smol-15-layers.gguf"))


def start(engine):
    who, mode = engine.split()
    if who == "abserve":
        extra = ["--draft-model", DRAFT] if mode == "draft" else []
        mode = "on" if mode == "draft" else mode
        return start_abserve(["--max-sequences", str(SLOTS), "--context", str(CTX),
                              "--speculative", mode] + extra), "m"
    return start_peer(SLOTS, CTX, peer_settings(mode)), "m"


def one_run(run):
    out = {}
    for engine in ENGINES:
        (p, base), model = start(engine)
        try:
            tokens_of(base, extraction(99, False, model))
            for work in WORKLOADS:
                for clients in CLIENTS:
                    print(f"run {run}: {engine}, {work}, {clients} clients", file=sys.stderr, flush=True)
                    try:
                        out[(engine, work, clients)] = measure(base, model, work, clients, run * 16)
                    except OSError as e:
                        # a server that died (llama.cpp's n-gram speculators have): its cells
                        # count as missing, said in the output
                        FAILED.append(f"run {run}: {engine} on {work} at {clients} clients: {e}")
                        out[(engine, work, clients)] = None
                        p.poll() is not None and FAILED.append(f"  {engine} exited with {p.returncode}")
                        stop(p)
                        (p, base), model = start(engine)
        finally:
            stop(p)
    return out


FAILED = []


def med_of(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--save", help="append each finished run to this file (JSON lines)")
    ap.add_argument("--report", help="print the table of the runs saved in this file, run nothing")
    a = ap.parse_args()
    if a.report:
        runs = [{tuple(k.split("|")[:2]) + (int(k.split("|")[2]),): v for k, v in json.loads(line).items()}
                for line in open(a.report)]
    else:
        runs = []
        for r in range(a.runs):
            runs.append(one_run(r))
            if a.save:
                with open(a.save, "a") as f:
                    f.write(json.dumps({"|".join(map(str, k)): v for k, v in runs[-1].items()}) + "\n")
    report(runs)


def report(runs):
    med = {k: med_of(r[k] for r in runs) for k in runs[0]}
    spread = {k: (min((r[k] for r in runs if r[k] is not None), default=float("nan")),
                  max((r[k] for r in runs if r[k] is not None), default=float("nan"))) for k in runs[0]}
    print(f"Decode tokens/s, medians of {len(runs)} runs (min–max):\n")
    print("| workload | clients | " + " | ".join(ENGINES) + " | on/off | on/llama best | best llama |")
    print("|---|---|" + "---|" * (len(ENGINES) + 3))
    for work in WORKLOADS:
        for c in CLIENTS:
            cells = [f"{med[(e, work, c)]:.1f} ({spread[(e, work, c)][0]:.0f}–{spread[(e, work, c)][1]:.0f})"
                     for e in ENGINES]
            peers = {e: med[(e, work, c)] for e in ENGINES if e.startswith("llama") and med[(e, work, c)] == med[(e, work, c)]}
            best = max(peers, key=peers.get) if peers else "-"
            # ratios per run, then their median
            r_off = med_of(r[("abserve on", work, c)] / r[("abserve off", work, c)] for r in runs)
            r_peer = med_of(r[("abserve on", work, c)] / max(r[(e, work, c)] or 0 for e in peers)
                            if peers else None for r in runs)
            print(f"| {work} | {c} | " + " | ".join(cells) + f" | {r_off:.2f} | {r_peer:.2f} | {best} |")
    for f in FAILED:
        print("failed:", f)
    print("\nraw:", json.dumps({"|".join(map(str, k)): [r[k] for r in runs] for k in runs[0]}))


if __name__ == "__main__":
    main()
