#!/usr/bin/env bash
# The GPU check's peer: llama.cpp's own server (`llama-server`) at the llama.cpp version that
# xllamacpp 2026.10.11549 vendors (the peer of every CPU benchmark here), built for the device.
#
#   bash scripts/gpu-peer.sh source OUT.tar.xz   # here: the trimmed llama.cpp source from the
#                                                # xllamacpp sdist on PyPI (about 6 MB)
#   bash scripts/gpu-peer.sh build SRC.tar.xz DIR [cuda|cpu]
#                                                # anywhere with cmake and a C++ compiler (and
#                                                # nvcc for cuda): DIR/build/bin/llama-server
#
# The lent GPU machines have nvcc, cmake and 16 cores but no network, so scripts/gpu-carry.sh
# carries the source and starts this build there in the background while the rest travels.
set -euo pipefail
case "${1:-}" in
  source)
    out=$(readlink -f "$2")
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    python3 -m pip download --quiet --no-deps --no-binary=:all: xllamacpp==2026.10.11549 -d "$tmp"
    tar -C "$tmp" -xzf "$tmp"/xllamacpp-2026.10.11549.tar.gz
    src=$tmp/xllamacpp-2026.10.11549/thirdparty/llama.cpp
    mkdir -p "$tmp/peer-src"
    (cd "$src" && tar cf - --exclude=tools/ui/src --exclude=tools/ui/tests --exclude='*.gguf' \
      CMakeLists.txt CMakePresets.json LICENSE cmake common ggml include src vendor tools \
      scripts/ui-assets.cmake licenses) | tar -C "$tmp/peer-src" -xf -
    tar -C "$tmp" -cJf "$out" peer-src
    ls -l "$out"
    ;;
  build)
    src=$2 dir=$3 kind=${4:-cuda}
    mkdir -p "$dir"
    tar -C "$dir" -xJf "$src"
    flags=(-DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON
      -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
      # the CPU kernels abserve's build uses (.cargo/config.toml), not -march=native: a native
      # build picked AMX on this machine's CPU and died at start with SIGILL
      -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
    if [ "$kind" = cuda ]; then
      nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
      flags+=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90}" -DCMAKE_CUDA_COMPILER="$nvcc")
    fi
    gen=()
    command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
    cmake -S "$dir/peer-src" -B "$dir/build" "${gen[@]}" "${flags[@]}"
    cmake --build "$dir/build" --target llama-server -j "${JOBS:-$(nproc)}"
    # run it where it was built: its shared libraries lie beside it (the build tree's rpath)
    echo "gpu-peer: $dir/build/bin/llama-server"
    ;;
  *)
    sed -n '2,11p' "$0" >&2
    exit 2
    ;;
esac
