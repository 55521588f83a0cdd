#!/usr/bin/env bash
# The whole test suite: installs what it needs, then runs every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo test --release --workspace --no-fail-fast 2>&1
