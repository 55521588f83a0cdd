#!/usr/bin/env python3
"""Writes a random LoRA adapter for a GGUF model, in the GGUF LoRA format that llama.cpp's
convert_lora_to_gguf.py writes (general.type = adapter, adapter.type = lora, adapter.lora.alpha,
tensors `<base tensor>.lora_a` [in, r] and `.lora_b` [r, out] in ggml's order), for the tests
and benchmarks of adapter variants. Test assets like this are never committed; OUT goes to an
ignored folder. Needs the `gguf` package (scripts/test.sh installs it into .venv).

    python3 scripts/test-lora.py MODEL OUT [--rank 8] [--alpha 16] [--seed 1] [--std 0.12]
        [--targets attn_q,attn_k,attn_v,attn_output,ffn_gate,ffn_up,ffn_down] [--type f32|f16]

A is drawn from N(0, 1/in), B from N(0, std²): at scale 1 the adapter moves each targeted weight
by (alpha/rank)·B·A, enough to change the default model's greedy tokens. Stored as F32 by
default (the tests' recorded references name these files' sha256); `--type f16` stores the same
draws as F16, the type convert_lora_to_gguf.py writes by default (its `--outtype f16`).
"""
import argparse

import gguf
import numpy as np


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("out")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--alpha", type=float, default=16.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--std", type=float, default=0.12)
    p.add_argument("--targets", default="attn_q,attn_k,attn_v,attn_output,ffn_gate,ffn_up,ffn_down")
    p.add_argument("--type", choices=["f32", "f16"], default="f32")
    a = p.parse_args()
    targets = set(a.targets.split(","))
    reader = gguf.GGUFReader(a.model)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    rng = np.random.default_rng(a.seed)
    writer = gguf.GGUFWriter(a.out, arch=arch)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, a.alpha)
    writer.add_name(f"random LoRA r={a.rank} seed={a.seed}")
    n = 0
    for t in reader.tensors:
        parts = t.name.split(".")
        if len(parts) != 4 or parts[0] != "blk" or parts[2] not in targets or parts[3] != "weight":
            continue
        n_in, n_out = int(t.shape[0]), int(t.shape[1])  # ggml order: ne[0] = in, ne[1] = out
        lora_a = rng.normal(0.0, 1.0 / np.sqrt(n_in), size=(a.rank, n_in)).astype(np.float32)
        lora_b = rng.normal(0.0, a.std, size=(n_out, a.rank)).astype(np.float32)
        dtype = np.float16 if a.type == "f16" else np.float32
        writer.add_tensor(t.name + ".lora_a", lora_a.astype(dtype))
        writer.add_tensor(t.name + ".lora_b", lora_b.astype(dtype))
        n += 1
    if n == 0:
        raise SystemExit(f"{a.model}: no tensor matches {sorted(targets)}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main()
