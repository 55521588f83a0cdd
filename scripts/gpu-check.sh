#!/usr/bin/env bash
# The GPU check, for a machine with a GPU (CI never needs one): builds abserve with CUDA (or
# Vulkan when there is no CUDA toolkit), lists the devices, prints the memory plan for the
# default model and for the problem statement's hypothetical (82,208,358,400 bytes of weights on
# a 96 GiB device), runs 8 concurrent prompt variants × 16 prompts with --assert-no-oom, prints
# planned against actual device memory, and measures tokens/s against llama.cpp's own server on
# the same GPU (xllamacpp, where a GPU build of it installs; else the peer is skipped).
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
"$bin" devices | tee "$out/devices.txt"
"$bin" plan --model "$model" --context 2048 | tee "$out/plan-default.txt"
"$bin" plan --weights-bytes 82208358400 --layers 80 --kv-heads 8 --head-dim 128 \
  --device-memory 96GiB --context 4096 | tee "$out/plan-hypothetical.txt"

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$bin" serve --model "$model" --port "$port" --context 2048 --max-sequences 16 >"$out/serve.out" 2>"$out/serve.log" &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  grep -q "listening on" "$out/serve.out" 2>/dev/null && break
  sleep 1
done
grep -E "device|memory measured" "$out/serve.log" | tee "$out/device-memory.txt"
# 8 variants (distinct system prompts) × 16 prompts, all at once, no OOM allowed
"$bin" loadtest --url "http://127.0.0.1:$port" --variants 8 --concurrency 8 --requests 128 \
  --prompt-tokens 64 --max-tokens 64 --ignore-eos --stream --assert-no-oom --json >"$out/loadtest.json"
python3 - "$out/loadtest.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
m = r.get("memory") or {}
print(f"abserve: {r['generated_tokens_per_second']:.1f} generated tok/s over {r['sent']} requests; "
      f"device peak used by abserve {m.get('peak_device_bytes')} B of budget {m.get('device_budget_bytes')} B; "
      f"failures: {r.get('failures')}")
PY
curl -s "http://127.0.0.1:$port/ready" | python3 -m json.tool | tee "$out/ready.json"
kill $pid; wait $pid || true
trap - EXIT

# the peer: llama.cpp's server with the same settings, when xllamacpp has a GPU build here
python3 -m venv "$out/venv" && "$out/venv/bin/pip" install --quiet --retries 0 --timeout 10 "xllamacpp==2026.10.11549" || true
if "$out/venv/bin/python" -c 'import xllamacpp' 2>/dev/null; then
  ABSERVE_BIN="$bin" PEER_GPU_LAYERS=999 "$out/venv/bin/python" bench/ab_traffic.py --runs 1 --only ab8 | tee "$out/peer.txt" \
    || echo "gpu-check: the peer comparison failed (is xllamacpp's build a GPU build?)" | tee "$out/peer.txt"
else
  echo "gpu-check: no GPU build of xllamacpp installs here; peer skipped" | tee "$out/peer.txt"
fi
