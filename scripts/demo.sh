#!/usr/bin/env bash
# The main job end to end on the default model: install what is missing, build, print the
# memory plan, then run eight prompt variants at once on ONE shared copy of the model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release --bin abserve
./target/release/abserve plan --memory-budget 1GiB --context 1024
./target/release/abserve generate --memory-budget 1GiB --context 1024 --prompts examples/variants.jsonl
