#!/usr/bin/env python3
"""Records greedy continuations from llama.cpp's own server loop (the prebuilt PyPI package
`xllamacpp`) for the default model with a random LoRA adapter (scripts/test-lora.py, seed 1)
at several scales, batch 1, and with a set of two adapters (seeds 1 and 2) applied together, so
that abserve's adapter path can be compared token for token (crates/engine/tests/adapters.rs).
The adapters are made here exactly as the test makes them, and their sha256 go into the
fixture so that a different adapter is caught rather than compared.
Regenerate with:

    .venv/bin/pip install xllamacpp==2026.10.11549
    .venv/bin/python scripts/record_lora_reference.py models/SmolLM2-135M-Instruct.Q4_1.gguf \
        > crates/engine/tests/fixtures/reference_lora.json
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import xllamacpp as xlc
from record_reference import params

MAX_TOKENS = 24
SCALES = [1.0, 0.5]
# scales of (seed 1, seed 2) applied together
SET_SCALES = [[0.5, 0.5], [0.25, 0.5]]
PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):"]


def make_lora(model, seed):
    lora = os.path.join(tempfile.mkdtemp(), f"lora-r8-seed{seed}.gguf")
    here = os.path.dirname(os.path.abspath(__file__))
    subprocess.run([sys.executable, os.path.join(here, "test-lora.py"), model, lora, "--seed", str(seed)], check=True)
    return lora, hashlib.sha256(open(lora, "rb").read()).hexdigest()


def answer(r):
    """A reference case's answer: prompt size, greedy tokens and text."""
    return {"prompt_tokens": r["usage"]["prompt_tokens"],
            "tokens": [c["id"] for c in r["choices"][0]["logprobs"]["content"]],
            "text": r["choices"][0]["text"]}


def main():
    model = sys.argv[1]
    lora, sha = make_lora(model, 1)
    lora2, sha2 = make_lora(model, 2)
    p = params(model)
    p.lora_adapters = [xlc.CommonAdapterLoraInfo(lora, 1.0)]
    s = xlc.Server(p)
    out = {"source": f"xllamacpp {xlc.__version__}", "adapter": "scripts/test-lora.py MODEL OUT --seed 1",
           "adapter_sha256": sha, "max_tokens": MAX_TOKENS, "cases": []}
    for scale in SCALES + [0.0]:
        for prompt in PROMPTS:
            r = s.handle_completions({"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "logprobs": 1,
                                      "cache_prompt": False, "lora": [{"id": 0, "scale": scale}]})
            out["cases"].append({"prompt": prompt, "scale": scale, **answer(r)})
    # the set: both adapters loaded, each request naming both scales
    p = params(model)
    p.lora_adapters = [xlc.CommonAdapterLoraInfo(lora, 1.0), xlc.CommonAdapterLoraInfo(lora2, 1.0)]
    s = xlc.Server(p)
    out["adapter2"] = "scripts/test-lora.py MODEL OUT --seed 2"
    out["adapter2_sha256"] = sha2
    out["sets"] = []
    for scales in SET_SCALES:
        for prompt in PROMPTS:
            lora_req = [{"id": i, "scale": sc} for i, sc in enumerate(scales)]
            r = s.handle_completions({"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "logprobs": 1,
                                      "cache_prompt": False, "lora": lora_req})
            out["sets"].append({"prompt": prompt, "scales": scales, **answer(r)})
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
