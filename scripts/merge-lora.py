#!/usr/bin/env python3
"""Merges a GGUF LoRA adapter into its GGUF model at a scale, as a fine-tune would be shipped
(W' = W + scale * alpha/rank * B A; each adapted tensor dequantized, merged in float32 and
quantized back to its own type), for the adapter benchmark's naive setup: one llama.cpp server
per merged fine-tune. Needs the `gguf` package. Outputs go to ignored folders; never commit them.

    python3 scripts/merge-lora.py MODEL LORA OUT [--scale 1.0]
"""
import argparse

import gguf
import numpy as np
from gguf import quants
from gguf_copy import copy_fields


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("lora")
    p.add_argument("out")
    p.add_argument("--scale", type=float, default=1.0)
    a = p.parse_args()
    base = gguf.GGUFReader(a.model)
    lora = gguf.GGUFReader(a.lora)
    alpha = float(lora.fields["adapter.lora.alpha"].contents())
    pairs = {t.name: t for t in lora.tensors}
    arch = base.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(a.out, arch=arch)
    copy_fields(base, writer)
    merged = 0
    for t in base.tensors:
        la, lb = pairs.get(t.name + ".lora_a"), pairs.get(t.name + ".lora_b")
        if la is None or lb is None:
            writer.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
            continue
        w = quants.dequantize(t.data, t.tensor_type)  # [out, in] in numpy's order
        A = np.asarray(la.data, dtype=np.float32)  # [rank, in]
        B = np.asarray(lb.data, dtype=np.float32)  # [out, rank]
        rank = A.shape[0]
        w = w + (a.scale * alpha / rank) * (B @ A)
        q = quants.quantize(w.astype(np.float32), t.tensor_type)
        writer.add_tensor(t.name, q, raw_shape=q.shape, raw_dtype=t.tensor_type)
        merged += 1
    if merged == 0:
        raise SystemExit(f"{a.lora}: adapts no tensor of {a.model}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"merged {merged} tensors of {a.lora} at scale {a.scale} into {a.out}")


if __name__ == "__main__":
    main()
