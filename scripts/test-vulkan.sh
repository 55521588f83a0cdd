#!/usr/bin/env bash
# The Vulkan test set on Mesa's software Vulkan device (lavapipe): builds the vulkan feature in
# its own target directory (scripts/vulkan-build.sh) and runs crates/cli/tests/vulkan.rs there.
# Needs the CPU build too (target/release/abserve), for the reference answers.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/vulkan-build.sh
sdk=$PWD/target/vulkan-sdk
# no debug line tables in this build (its own target directory; the CPU build keeps them):
# less to compile and link in CI. vulkan-build.sh and test-vulkan.sh must agree, or cargo
# rebuilds everything.
export CARGO_PROFILE_RELEASE_DEBUG=0
export VULKAN_SDK=$sdk/usr CPATH=$sdk/usr/include${CPATH:+:$CPATH}
[ -x target/release/abserve ] || cargo build --release --bin abserve
# lavapipe is a Vulkan device of type CPU, which ggml leaves out unless it is named here
export GGML_VK_VISIBLE_DEVICES=${GGML_VK_VISIBLE_DEVICES:-0}
CARGO_TARGET_DIR=target/vulkan cargo test --release --features vulkan -p abserve --test vulkan -- --test-threads 1 --nocapture
