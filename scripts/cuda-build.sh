#!/usr/bin/env bash
# Builds abserve with llama.cpp's CUDA backend, in its own target directory (target/cuda). Needs
# no GPU: the build only compiles the kernels.
#
# The CUDA toolkit: `nvcc` on PATH (or CUDA_PATH) when one is installed. Otherwise NVIDIA's own
# wheels from PyPI (nvcc, cicc, the runtime and cuBLAS headers and libraries; CUDA 13.0, which the
# 580 drivers run) are unpacked into target/cuda-sdk; nothing is installed on the system. Those
# wheels ship shared libraries only, so llama.cpp is built as shared libraries
# (LLAMA_BUILD_SHARED_LIBS=1: libllama.so, libggml*.so beside the binary) and links libcudart.so.13
# and libcublas.so.13 at run time. They hold no libcuda.so (the driver's library, which
# only a machine with the driver has): a stand-in with its soname and the functions ggml calls
# lets the build link, and the driver's own library is the one loaded at run time.
#
#   CUDA_ARCHS=90 bash scripts/cuda-build.sh     # default: 90 (H100/H200); e.g. "80;86;89;90"
#   bash scripts/cuda-build.sh --pack            # also target/cuda/abserve-cuda.tar.xz
#
# Output: target/cuda/bundle/ (abserve and llama.cpp's libraries, stripped). Run it with
# LD_LIBRARY_PATH naming that folder and the CUDA 13 runtime and cuBLAS libraries (a CUDA 13
# toolkit's lib64, or pip's nvidia/cu13/lib); scripts/gpu-check.sh does.
set -euo pipefail
cd "$(dirname "$0")/.."
pack=""
if [ "${1:-}" = "--pack" ]; then pack=1; fi
archs=${CUDA_ARCHS:-90}
wheel_sdk=""
if [ -n "${CUDA_PATH:-}" ] && [ -x "$CUDA_PATH/bin/nvcc" ]; then
  cuda=$CUDA_PATH
elif command -v nvcc >/dev/null 2>&1; then
  cuda=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
else
  sdk=$PWD/target/cuda-sdk
  cuda=$sdk/nvidia/cu13
  if [ ! -x "$cuda/nvvm/bin/cicc" ]; then
    mkdir -p "$sdk/wheels"
    # pinned: CUDA 13.0 (driver 580 and newer); cuBLAS 13.0 is ~420 MB to download
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
      --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform manylinux_2_12_x86_64 -d "$sdk/wheels" \
      nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 \
      nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 nvidia-cublas==13.0.2.14
    for w in "$sdk"/wheels/*.whl; do python3 -m zipfile -e "$w" "$sdk"; done
    chmod +x "$cuda"/bin/* "$cuda"/nvvm/bin/*
  fi
  for l in cudart cublas cublasLt; do ln -sf "lib$l.so.13" "$cuda/lib/lib$l.so"; done
  ln -sfn lib "$cuda/lib64"
  # the driver functions ggml-cuda calls (its VMM pool), so that the linker keeps libcuda.so.1
  # as a needed library of libggml-cuda.so; they resolve against the driver at run time
  mkdir -p "$cuda/lib/stubs"
  for f in cuDeviceGet cuDeviceGetAttribute cuGetErrorString cuMemAddressFree \
    cuMemAddressReserve cuMemCreate cuMemGetAllocationGranularity cuMemMap cuMemRelease \
    cuMemSetAccess cuMemUnmap; do
    echo "int $f(void) { return 999; }"
  done >"$sdk/stub.c"
  cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$cuda/lib/stubs/libcuda.so" "$sdk/stub.c"
  wheel_sdk=1
fi
echo "cuda-build: toolkit $cuda ($("$cuda/bin/nvcc" --version | tail -1)), architectures $archs" >&2
export CUDA_PATH=$cuda CUDAToolkit_ROOT=$cuda
export CMAKE_CUDA_COMPILER=$cuda/bin/nvcc CMAKE_CUDA_ARCHITECTURES=$archs
export LLAMA_BUILD_SHARED_LIBS=1
export CARGO_PROFILE_RELEASE_DEBUG=0
export PATH=$cuda/bin:$PATH
config=()
if [ -n "$wheel_sdk" ]; then
  # libggml-cuda.so's driver symbols resolve at run time against the driver's libcuda.so.1
  config=(--config 'target.x86_64-unknown-linux-gnu.rustflags=["-C", "link-arg=-Wl,--allow-shlib-undefined"]')
fi
CARGO_TARGET_DIR=target/cuda cargo build "${config[@]}" --release --features cuda --bin abserve
echo "cuda-build: target/cuda/release/abserve" >&2
bundle=target/cuda/bundle
rm -rf "$bundle" && mkdir -p "$bundle"
cp target/cuda/release/abserve "$bundle/"
# the libraries by their sonames (cargo's copies beside the binary are links to them)
for lib in target/cuda/release/build/llama-cpp-sys-2-*/out/lib/lib*.so.0; do
  cp -L "$lib" "$bundle/"
done
strip "$bundle"/*
du -sh "$bundle" >&2
if [ -n "$pack" ]; then
  tar -C target/cuda -cJf target/cuda/abserve-cuda.tar.xz bundle
  ls -l target/cuda/abserve-cuda.tar.xz >&2
fi
