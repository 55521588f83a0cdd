#!/usr/bin/env bash
# Builds abserve with llama.cpp's Vulkan backend into target/vulkan/release/abserve, for the
# software Vulkan device of Mesa (lavapipe/llvmpipe) or a real GPU.
#
# It builds in the shared target directory, where cargo keeps both feature sets side by side:
# only llama.cpp and the crates above it compile again, every other dependency is the CPU
# build's. target/release/abserve stays the CPU build: the Vulkan binary that cargo puts there is
# copied to target/vulkan/release and the CPU binary put back. (Do not run the CPU tests at the
# same time; a `cargo build --release --bin abserve` puts the CPU binary back too.)
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
# VULKAN_SDK points CMake's FindVulkan at the headers. (Not CPATH: the cc-based build scripts of
# other dependencies rerun when it changes, and the CPU build would then compile them again.)
export VULKAN_SDK=$sdk/usr
mkdir -p target/vulkan/release
saved=target/vulkan/cpu-abserve.saved
if [ -f target/release/abserve ]; then
  cp -p target/release/abserve "$saved"
  trap 'mv -f "$saved" target/release/abserve' EXIT
else
  trap 'rm -f target/release/abserve' EXIT
fi
cargo build --release --features vulkan --bin abserve "$@"
cp -f target/release/abserve target/vulkan/release/abserve
echo "vulkan-build: target/vulkan/release/abserve"
