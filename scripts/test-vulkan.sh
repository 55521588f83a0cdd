#!/usr/bin/env bash
# The Vulkan test set on Mesa's software Vulkan device (lavapipe): builds the vulkan feature
# (scripts/vulkan-build.sh, in the shared target directory) and runs crates/cli/tests/vulkan.rs.
# Needs the CPU build too, for the reference answers: `cargo test --features vulkan` puts the
# Vulkan binary at target/release/abserve, so the test gets a copy of the CPU binary
# (ABSERVE_CPU_BIN), and the CPU binary is put back at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x target/release/abserve ] || cargo build --release --bin abserve
bash scripts/vulkan-build.sh
export VULKAN_SDK=$PWD/target/vulkan-sdk/usr
cpu=$PWD/target/vulkan/cpu-abserve
cp -p target/release/abserve "$cpu"
trap 'cp -p "$cpu" target/release/abserve' EXIT
# lavapipe is a Vulkan device of type CPU, which ggml leaves out unless it is named here
export GGML_VK_VISIBLE_DEVICES=${GGML_VK_VISIBLE_DEVICES:-0}
ABSERVE_CPU_BIN=$cpu cargo test --release --features vulkan -p abserve --test vulkan -- --test-threads 1 --nocapture
