#!/usr/bin/env bash
# Takes the GPU check to a lent GPU machine that has no cargo and no network (the `device` tool's
# machines): what it needs travels in `carry`, at most 64 MiB a call, so it goes in three calls.
#
# Here:   bash scripts/gpu-carry.sh prepare
#         (builds target/cuda with scripts/cuda-build.sh --pack and fills .gpu/: the default
#         model in two parts, a test LoRA adapter, the CUDA bundle, and the llama.cpp source of
#         the peer, llama.cpp's own server, from scripts/gpu-peer.sh)
# There, in three calls made one right after the other (the machine stays warm ~30 s):
#   carry [".gpu/peer-src.tar.xz", ".gpu/model.part2", ".gpu/lora-a.gguf"]
#                                       command: bash scripts/gpu-carry.sh part2
#       (also starts building the peer there, in the background, on most of its cores)
#   carry [".gpu/model.part1"]          command: bash scripts/gpu-carry.sh part1
#   carry [".gpu/abserve-cuda.tar.xz"]  command: bash scripts/gpu-carry.sh check
# The last one runs scripts/gpu-check.sh on the bundle (the peer's parts last, once its build is
# done) and copies its output to $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
stage=/tmp/abserve-gpu
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
case "${1:-}" in
  prepare)
    bash scripts/get-model.sh >/dev/null
    bash scripts/cuda-build.sh --pack
    mkdir -p .gpu
    bash scripts/gpu-peer.sh source .gpu/peer-src.tar.xz
    py=python3
    [ -x .venv/bin/python ] && py=.venv/bin/python
    "$py" scripts/test-lora.py "$model" .gpu/lora-a.gguf
    cp target/cuda/abserve-cuda.tar.xz .gpu/
    head -c $((58 << 20)) "$model" >.gpu/model.part1
    tail -c +$(((58 << 20) + 1)) "$model" >.gpu/model.part2
    ls -l .gpu
    ;;
  part1 | part2)
    mkdir -p "$stage"
    cp ".gpu/model.$1" "$stage/"
    if [ "$1" = part2 ]; then
      [ -f .gpu/lora-a.gguf ] && cp .gpu/lora-a.gguf "$stage/"
      if [ -f .gpu/peer-src.tar.xz ]; then
        cp .gpu/peer-src.tar.xz "$stage/"
        cp scripts/gpu-peer.sh "$stage/"
        # a new session, so that it outlives this call; 14 of the 16 cores, below normal priority
        JOBS=14 setsid nice -n 10 bash "$stage/gpu-peer.sh" build "$stage/peer-src.tar.xz" "$stage/peer" cuda \
          >"$stage/peer-build.log" 2>&1 </dev/null &
        echo "gpu-carry: building the peer in the background ($stage/peer-build.log)"
      fi
    fi
    ls -l "$stage"
    ;;
  check)
    [ -f "$stage/model.part1" ] && [ -f "$stage/model.part2" ] \
      || { echo "gpu-carry: the model's parts are not in $stage (a fresh machine: start again with part1)" >&2; exit 1; }
    cat "$stage/model.part1" "$stage/model.part2" >"$stage/model.gguf"
    sha=$(sed -n 's/^SHA=//p' scripts/get-model.sh)
    [ "$(sha256sum "$stage/model.gguf" | cut -d' ' -f1)" = "$sha" ] \
      || { echo "gpu-carry: the model's checksum differs" >&2; exit 1; }
    python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" \
      .gpu/abserve-cuda.tar.xz "$stage"
    nvidia-smi || true
    status=0
    ABSERVE_BIN=$stage/bundle/abserve ABSERVE_MODEL=$stage/model.gguf ABSERVE_LORA=$stage/lora-a.gguf \
      ABSERVE_PEER=$stage/peer/build/bin/llama-server ABSERVE_PEER_LOG=$stage/peer-build.log \
      bash scripts/gpu-check.sh \
      || status=$?
    if [ -n "${OUT:-}" ]; then
      cp gpu-check-out/gpu-check.txt gpu-check-out/gpu-check.json gpu-check-out/logs.tar.gz "$OUT/" 2>/dev/null || true
    fi
    exit $status
    ;;
  *)
    sed -n '2,17p' "$0" >&2
    exit 2
    ;;
esac
