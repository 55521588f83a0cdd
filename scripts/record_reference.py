#!/usr/bin/env python3
"""Records greedy continuations from llama.cpp's own server loop (the prebuilt PyPI package
`xllamacpp`) for the default model, batch 1, so that the engine's output can be compared token for
token. Regenerate with:

    .venv/bin/pip install xllamacpp==2026.10.11549
    .venv/bin/python scripts/record_reference.py models/SmolLM2-135M-Instruct.Q4_1.gguf \
        > crates/engine/tests/fixtures/reference_greedy.json
"""
import json
import sys

import xllamacpp as xlc

MAX_TOKENS = 32
COMPLETIONS = [
    "The capital of France is",
    "Once upon a time",
    "def fibonacci(n):",
    "The three primary colors are",
    "Water boils at a temperature of",
    "In machine learning, overfitting means",
]
CHATS = [
    [{"role": "user", "content": "What is the tallest mountain on Earth?"}],
    [
        {"role": "system", "content": "You are a terse assistant. Answer in one sentence."},
        {"role": "user", "content": "Why is the sky blue?"},
    ],
]


def tokens_of(resp):
    return [c["id"] for c in resp["choices"][0]["logprobs"]["content"]]


def params(model, flash):
    """llama.cpp's server settings of the reference runs: batch 1, 2 threads, flash attention on
    or off."""
    p = xlc.CommonParams()
    p.model.path = model
    p.n_ctx = 2048
    p.n_parallel = 1
    p.cpuparams.n_threads = 2
    p.cpuparams_batch.n_threads = 2
    kind = "ENABLED" if flash else "DISABLED"
    p.flash_attn_type = getattr(xlc.llama_flash_attn_type, f"LLAMA_FLASH_ATTN_TYPE_{kind}")
    return p


def main():
    model = sys.argv[1]
    runs = [record(model, flash) for flash in (False, True)]
    json.dump({"source": f"xllamacpp {xlc.__version__}", "max_tokens": MAX_TOKENS, "runs": runs}, sys.stdout, indent=1)
    print()


def record(model, flash):
    """Every prompt's greedy continuation with flash attention on or off."""
    s = xlc.Server(params(model, flash))
    out = {"flash_attention": flash, "completions": [], "chats": []}
    for prompt in COMPLETIONS:
        r = s.handle_completions(
            {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "logprobs": 1, "cache_prompt": False}
        )
        out["completions"].append(
            {
                "prompt": prompt,
                "prompt_tokens": r["usage"]["prompt_tokens"],
                "tokens": tokens_of(r),
                "text": r["choices"][0]["text"],
            }
        )
    for messages in CHATS:
        r = s.handle_chat_completions(
            {"messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0, "logprobs": True, "top_logprobs": 1, "cache_prompt": False}
        )
        out["chats"].append(
            {
                "messages": messages,
                "prompt_tokens": r["usage"]["prompt_tokens"],
                "tokens": tokens_of(r),
                "text": r["choices"][0]["message"]["content"],
            }
        )
    del s
    return out


if __name__ == "__main__":
    main()
