#!/usr/bin/env python3
"""Writes a smaller model of the same family from a GGUF model: its first N transformer blocks
(with the embeddings, the output norm and the output head), `<arch>.block_count = N`, every other
key and tensor copied unchanged. A second, different base model for the tests of several models
in one process (crates/engine/tests/models.rs): other weights, another KV size per token, the
same vocabulary. Test assets like this are never committed; OUT goes to an ignored folder. Needs
the `gguf` package (scripts/test.sh installs it into .venv).

    python3 scripts/test-model-layers.py MODEL OUT --layers N
"""
import argparse
import os

import gguf
from gguf_copy import copy_fields


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("out")
    p.add_argument("--layers", type=int, required=True)
    a = p.parse_args()
    base = gguf.GGUFReader(a.model)
    arch = base.fields["general.architecture"].contents()
    count_key = f"{arch}.block_count"
    n = int(base.fields[count_key].contents())
    if not 0 < a.layers < n:
        raise SystemExit(f"--layers must be between 1 and {n - 1}, got {a.layers}")
    tmp = a.out + ".part"
    writer = gguf.GGUFWriter(tmp, arch=arch)
    copy_fields(base, writer, {count_key: a.layers})
    kept = 0
    for t in base.tensors:
        if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= a.layers:
            continue
        writer.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
        kept += 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, a.out)
    print(f"kept {kept} tensors, {a.layers} of {n} blocks, in {a.out}")


if __name__ == "__main__":
    main()
