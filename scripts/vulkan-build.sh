#!/usr/bin/env bash
# Builds abserve with llama.cpp's Vulkan backend, in its own target directory (target/vulkan),
# for the software Vulkan device of Mesa (lavapipe/llvmpipe) or a real GPU.
#
# Debian bookworm's Vulkan headers (1.3.239) are older than llama.cpp's Vulkan backend needs
# (vk::LayerSettingEXT, 1.3.261+). Debian trixie's libvulkan-dev (1.4.309) has them: its .deb is
# taken from Debian's archive and unpacked into target/vulkan-sdk (nothing is installed from
# trixie); the program still links the system's libvulkan.so.1 loader.
set -euo pipefail
cd "$(dirname "$0")/.."
sudo=""
[ "$(id -u)" -ne 0 ] && sudo=sudo
need=()
for p in glslc spirv-headers glslang-tools mesa-vulkan-drivers vulkan-tools libvulkan1; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
sdk=$PWD/target/vulkan-sdk
deb=libvulkan-dev_1.4.309.0-1_amd64.deb
if [ ! -f "$sdk/usr/include/vulkan/vulkan.hpp" ]; then
  mkdir -p "$sdk"
  curl -fsSL -o "$sdk/$deb" "http://deb.debian.org/debian/pool/main/v/vulkan-loader/$deb"
  dpkg -x "$sdk/$deb" "$sdk"
fi
# the loader: the system's (bookworm) libvulkan.so.1
lib=$(ls /usr/lib/*/libvulkan.so.1 | head -1)
mkdir -p "$sdk/usr/lib"
ln -sf "$lib" "$sdk/usr/lib/libvulkan.so"
# no debug line tables in this build (its own target directory; the CPU build keeps them):
# less to compile and link in CI. vulkan-build.sh and test-vulkan.sh must agree, or cargo
# rebuilds everything.
export CARGO_PROFILE_RELEASE_DEBUG=0
export VULKAN_SDK=$sdk/usr
export CPATH=$sdk/usr/include${CPATH:+:$CPATH}
CARGO_TARGET_DIR=target/vulkan cargo build --release --features vulkan --bin abserve "$@"
echo "vulkan-build: target/vulkan/release/abserve"
