#!/usr/bin/env python3
"""Writes a copy of a GGUF model whose vocabulary asks for a BOS token at the start of every
prompt (`tokenizer.ggml.add_bos_token = true`, as Llama 3, Mistral and Gemma ship), for the
test that every path prepares the same prompt tokens (crates/cli/tests/one_path.rs).

    python3 scripts/test-model-bos.py MODEL OUT

Only that one byte differs from MODEL: the key already exists in the default model (false), so
the copy keeps every offset. Test assets like this are never committed; OUT goes to an ignored
folder. Needs the `gguf` package (scripts/test.sh installs it into .venv).
"""
import shutil
import sys

import gguf
import numpy as np


def main() -> None:
    src, out = sys.argv[1], sys.argv[2]
    tmp = out + ".part"
    shutil.copyfile(src, tmp)
    reader = gguf.GGUFReader(tmp, "r+")
    field = reader.fields.get("tokenizer.ggml.add_bos_token")
    if field is None:
        sys.exit(f"{src} has no tokenizer.ggml.add_bos_token to set")
    value = field.parts[field.data[0]]
    value[...] = np.array([True], dtype=value.dtype)
    reader.data.flush()
    del reader
    check = gguf.GGUFReader(tmp)
    f = check.fields["tokenizer.ggml.add_bos_token"]
    assert bool(f.parts[f.data[0]][0]), "the flag did not stick"
    shutil.move(tmp, out)


if __name__ == "__main__":
    main()
