#!/usr/bin/env bash
# Installs what abserve needs on a fresh Debian machine that has Rust: the build tools for
# llama.cpp (cmake, clang, libclang-dev) when missing, and the default model.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v clang >/dev/null 2>&1 || need+=(clang)
compgen -G "/usr/lib/llvm-*/lib/libclang*.so*" >/dev/null || compgen -G "/usr/lib/*/libclang*.so*" >/dev/null || need+=(libclang-dev)
# promtool checks the /metrics output in the tests
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
# headless Chromium renders abserve eval's HTML report in the tests
command -v chromium >/dev/null 2>&1 || need+=(chromium)
# ccache: llama.cpp's CMake (GGML_CCACHE, on by default) compiles through it when it is on the
# PATH, so a second build of the same llama.cpp on this machine (another clone, the Vulkan
# feature, CI again) takes its objects from ~/.cache/ccache instead of compiling them again
command -v ccache >/dev/null 2>&1 || need+=(ccache)
# sccache: the same for Rust crates (and the C code of -sys crates), used by scripts/test.sh
command -v sccache >/dev/null 2>&1 || need+=(sccache)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}" >&2
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi

bash scripts/get-model.sh
