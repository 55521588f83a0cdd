#!/usr/bin/env bash
# The main job end to end on the default model: install what is missing, build, print the
# memory plan, then evaluate four prompt variants of a support assistant over 50 customer
# questions at once on ONE shared copy of the model, with scorers, a judge, paired statistics
# and a report (eval-out/report.html). Rerunning resumes: finished answers are kept.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release --bin abserve
./target/release/abserve plan --memory-budget 1GiB --context 1024
./target/release/abserve eval examples/support-eval.toml --dataset examples/support-questions.jsonl \
    --out eval-out --memory-budget 1GiB --context 1024
