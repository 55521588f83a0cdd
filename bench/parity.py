#!/usr/bin/env python3
"""Greedy answers of abserve beside llama.cpp's own server (xllamacpp), prompt by prompt.

Both servers get the same chat requests one at a time (temperature 0, --max-tokens tokens,
logprobs with the top 2); each answer is compared token by token: identical or not, where it
parts, the log-probability gap of the top two at the parting token (a near-tie flips on a
rounding difference), and the largest difference of the chosen tokens' log-probabilities up to
the parting. Prompt tokens are checked identical first (llama.cpp's /apply-template +
/tokenize against abserve's return_token_ids).

    .venv/bin/python bench/parity.py [--peer KEY=VALUE ...] [--abserve-args "..."] [--json OUT]

--peer sets xllamacpp CommonParams fields (n_parallel, n_ctx, n_batch, n_ubatch, kv_unified,
flash=on|off, cache_prompt=on|off per request); --abserve-args adds flags to `abserve serve`.
"""
import argparse
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
# ABSERVE_BIN picks the abserve build there
from before_after import MODEL, start_abserve, stop  # noqa: E402
from before_after import start_peer as start_peer_process  # noqa: E402

# 32 prompts: questions, instructions, a system prompt of our own on some, a second turn on some
QUESTIONS = [
    "What is the capital of France?", "Explain photosynthesis in one paragraph.",
    "Write a haiku about the sea.", "List three uses of a paperclip.",
    "How do I reverse a list in Python?", "What causes the seasons on Earth?",
    "Give me a short motivational quote.", "Translate 'good morning' into Spanish and German.",
    "Why is the sky blue?", "Summarise the plot of Romeo and Juliet.",
    "What is 17 times 23?", "Name three rivers in Africa.",
    "Describe a cat to someone who has never seen one.", "What is the difference between weather and climate?",
    "Write a limerick about a programmer.", "How does a bicycle stay upright?",
    "What should I pack for a weekend hike?", "Explain what a database index is.",
    "Suggest a name for a bakery.", "What are the benefits of drinking water?",
    "How do vaccines work?", "Tell me a fun fact about octopuses.",
    "What is machine learning?", "Give two tips for better sleep.",
]
SYSTEMS = [None, "You are a concise assistant. Answer in at most two sentences.",
           "You are the support assistant of an online bookshop.", None]


def conversations():
    out = []
    for i, q in enumerate(QUESTIONS):
        msgs = []
        s = SYSTEMS[i % len(SYSTEMS)]
        if s:
            msgs.append({"role": "system", "content": s})
        msgs.append({"role": "user", "content": q})
        out.append(msgs)
    for i in range(8):
        out.append([{"role": "user", "content": QUESTIONS[i]},
                    {"role": "assistant", "content": "Let me think about that."},
                    {"role": "user", "content": "Please answer briefly."}])
    return out


def post(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def start_peer_bin(binary, opts):
    """llama.cpp's own llama-server binary (one built from source), with the same settings."""
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    args = [binary, "-m", str(MODEL), "--host", "127.0.0.1", "--port", str(port), "-t", "2", "-tb", "2",
            "-np", opts.get("n_parallel", "1"), "-c", opts.get("n_ctx", "1024"), "-fa", opts.get("flash", "on")]
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            with urllib.request.urlopen(base + "/health", timeout=1) as r:
                if r.status == 200:
                    return p, base
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError("llama-server did not start")


def start_peer(opts):
    """llama.cpp's server with `opts` (CommonParams fields; flash=on|off): the xllamacpp wheel,
    or the `llama-server` binary that PEER_BIN names."""
    if os.environ.get("PEER_BIN"):
        return start_peer_bin(os.environ["PEER_BIN"], opts)
    settings = []
    for k, v in opts.items():
        if k == "flash":
            e = "ENABLED" if v == "on" else "DISABLED"
            settings.append(f"p.flash_attn_type = x.llama_flash_attn_type.LLAMA_FLASH_ATTN_TYPE_{e}")
        elif k in ("cache_prompt", "n_parallel", "n_ctx"):
            continue
        elif v in ("true", "false"):
            settings.append(f"p.{k} = {v == 'true'}")
        else:
            settings.append(f"p.{k} = {int(v)}")
    parallel = int(opts.get("n_parallel", "1"))
    return start_peer_process(parallel, int(opts.get("n_ctx", "1024")) // parallel, settings)


def answer(client, model, msgs, max_tokens, extra):
    """One greedy chat answer through the official openai SDK: its text, and per generated token
    (token, log-probability, the top two log-probabilities), plus abserve's prompt token ids."""
    r = client.chat.completions.create(model=model, messages=msgs, max_tokens=max_tokens, temperature=0,
                                       logprobs=True, top_logprobs=2, extra_body=extra)
    c = r.choices[0]
    toks = [(t.token, t.logprob, [a.logprob for a in t.top_logprobs]) for t in c.logprobs.content]
    return {"text": c.message.content, "tokens": toks, "prompt_token_ids": (c.model_extra or {}).get("prompt_token_ids")}


def peer_prompt_ids(base, msgs):
    prompt = post(base, "/apply-template", {"messages": msgs})["prompt"]
    return post(base, "/tokenize", {"content": prompt, "add_special": True, "parse_special": True})["tokens"]


def compare(a, b):
    """(identical, parting index or None, top-2 gap there, max |dlogprob| before it, first-token |dlogprob|)."""
    ta, tb = a["tokens"], b["tokens"]
    n = min(len(ta), len(tb))
    part = next((i for i in range(n) if ta[i][0] != tb[i][0]), None)
    upto = part if part is not None else n
    d = [abs(ta[i][1] - tb[i][1]) for i in range(upto)]
    gap = None
    if part is not None:
        tops = tb[part][2]
        gap = tops[0] - tops[1] if len(tops) > 1 else None
    first = abs(ta[0][1] - tb[0][1]) if n else 0.0
    return a["text"] == b["text"], part, gap, max(d) if d else 0.0, first


def run(abserve_args, peer_opts, max_tokens, convs):
    cache = peer_opts.get("cache_prompt", "on") == "on"
    res = {}
    p, base = start_abserve(abserve_args)
    try:
        c = openai.OpenAI(base_url=base + "/v1", api_key="none")
        res["abserve"] = [answer(c, "m", m, max_tokens, {"return_token_ids": True}) for m in convs]
    finally:
        stop(p)
    p, base = start_peer(peer_opts)
    try:
        res["peer_ids"] = [peer_prompt_ids(base, m) for m in convs]
        c = openai.OpenAI(base_url=base + "/v1", api_key="none")
        res["llama.cpp"] = [answer(c, "m", m, max_tokens, {"cache_prompt": cache}) for m in convs]
    finally:
        stop(p)
    return res


def report(res, label):
    rows = [compare(a, b) for a, b in zip(res["abserve"], res["llama.cpp"])]
    same_ids = sum(a["prompt_token_ids"] == ids for a, ids in zip(res["abserve"], res["peer_ids"]))
    ident = sum(r[0] for r in rows)
    firsts = [r[4] for r in rows]
    parts = [(i, r[1], r[2]) for i, r in enumerate(rows) if not r[0]]
    print(f"{label}: identical {ident}/{len(rows)}, prompt ids equal {same_ids}/{len(rows)}, "
          f"first-token |dlogprob| median {statistics.median(firsts):.2g} max {max(firsts):.2g}; "
          f"partings (prompt, token, top-2 gap): {[(i, t, round(g, 3) if g is not None else None) for i, t, g in parts]}")
    return {"identical": ident, "n": len(rows), "first_median": statistics.median(firsts), "first_max": max(firsts),
            "parts": parts}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--abserve-args", default="--max-sequences 1 --context 1024")
    ap.add_argument("--peer", action="append", default=[], help="KEY=VALUE (CommonParams field, flash, cache_prompt)")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--json")
    a = ap.parse_args()
    opts = {"n_parallel": "1", "n_ctx": "1024"}
    opts.update(dict(kv.split("=", 1) for kv in a.peer))
    convs = conversations()
    res = run(shlex.split(a.abserve_args), opts, a.max_tokens, convs)
    out = report(res, f"abserve [{a.abserve_args}] vs llama.cpp {opts}")
    if a.json:
        Path(a.json).write_text(json.dumps({"summary": out, "raw": res}))


if __name__ == "__main__":
    main()
