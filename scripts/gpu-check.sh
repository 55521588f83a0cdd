#!/usr/bin/env bash
# The GPU check, for a machine with a GPU (CI never needs one): builds abserve with CUDA (or
# Vulkan when there is no CUDA toolkit) unless given a bundle, then runs bench/gpu_check.py:
# devices and plans, planned against allocated device memory, 8 variants × 16 prompts at full
# concurrency with --assert-no-oom and device use sampled, the prefix store on the device, and
# tokens/s against llama.cpp's own server built for the same device (when the bundle has one).
#
#   bash scripts/gpu-check.sh            # output: gpu-check-out/
#
# On a machine without cargo or network (the GPU machines lent here), run a bundle built
# elsewhere (scripts/cuda-build.sh --bundle DIR): ABSERVE_BIN=DIR/abserve, and ABSERVE_MODEL
# for the model's path. The CUDA 13 runtime and cuBLAS libraries are then looked up in Python's
# site-packages (NVIDIA's wheels, which PyTorch installs) when the loader does not find them.
set -euo pipefail
cd "$(dirname "$0")/.."
out=gpu-check-out
mkdir -p "$out"
model=${ABSERVE_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
if [ -n "${ABSERVE_BIN:-}" ]; then
  bin=$ABSERVE_BIN
elif command -v nvcc >/dev/null 2>&1 || [ -n "${CUDA_PATH:-}" ]; then
  bash scripts/setup.sh
  bash scripts/cuda-build.sh
  bin=target/cuda/release/abserve
else
  bash scripts/setup.sh
  echo "gpu-check: no CUDA toolkit (nvcc); building the Vulkan backend" >&2
  bash scripts/vulkan-build.sh
  bin=target/vulkan/release/abserve
fi
# a CUDA build made by scripts/cuda-build.sh: llama.cpp's shared libraries lie beside the binary
libs=$(dirname "$(readlink -f "$bin")")
if ! ldconfig -p | grep -q 'libcublas.so.13'; then
  cu=$(python3 - <<'PY' || true
import glob, site, sys
for d in site.getsitepackages() + [site.getusersitepackages()] + sys.path:
    for hit in glob.glob(f"{d}/nvidia/cu13/lib/libcublas.so.13") + glob.glob(f"{d}/nvidia/cublas/lib/libcublas.so.13"):
        print(hit.rsplit("/", 1)[0]); sys.exit()
PY
)
  [ -n "$cu" ] && libs=$libs:$cu
fi
export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# the peer: llama.cpp's own server for the same device (scripts/gpu-peer.sh; gpu-carry.sh builds
# it there in the background, so the check waits for it before the peer's parts), and a LoRA
# adapter made by scripts/test-lora.py
peer=${ABSERVE_PEER:-target/gpu-peer/build/bin/llama-server}
lora=${ABSERVE_LORA:-models/test/lora-r8-seed1.gguf}
args=(--bin "$bin" --model "$model" --out "$out" --peer "$peer")
[ -n "${ABSERVE_PEER_LOG:-}" ] && args+=(--peer-log "$ABSERVE_PEER_LOG")
[ -f "$lora" ] && args+=(--lora "$lora")
PYTHONUNBUFFERED=1 python3 bench/gpu_check.py "${args[@]}" ${GPU_CHECK_ARGS:-}
