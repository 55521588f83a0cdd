#!/usr/bin/env bash
# Takes the GPU check to a lent GPU machine that has no cargo and no network (the `device` tool's
# machines): what it needs travels in `carry`, at most 64 MiB a call, so it goes in three calls.
#
# Here:   bash scripts/gpu-carry.sh prepare
#         (builds target/cuda with scripts/cuda-build.sh --pack and fills .gpu/: the default
#         model in two parts and the CUDA bundle, 47 MiB)
# There, in three calls made one right after the other (the machine stays warm ~30 s):
#   carry [".gpu/model.part1"]          command: bash scripts/gpu-carry.sh part1
#   carry [".gpu/model.part2"]          command: bash scripts/gpu-carry.sh part2
#   carry [".gpu/abserve-cuda.tar.xz"]  command: bash scripts/gpu-carry.sh check
# The last one runs scripts/gpu-check.sh on the bundle and copies its output to $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
stage=/tmp/abserve-gpu
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
case "${1:-}" in
  prepare)
    bash scripts/get-model.sh >/dev/null
    bash scripts/cuda-build.sh --pack
    mkdir -p .gpu
    cp target/cuda/abserve-cuda.tar.xz .gpu/
    head -c $((58 << 20)) "$model" >.gpu/model.part1
    tail -c +$(((58 << 20) + 1)) "$model" >.gpu/model.part2
    ls -l .gpu
    ;;
  part1 | part2)
    mkdir -p "$stage"
    cp ".gpu/model.$1" "$stage/"
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
    ABSERVE_BIN=$stage/bundle/abserve ABSERVE_MODEL=$stage/model.gguf bash scripts/gpu-check.sh \
      || status=$?
    if [ -n "${OUT:-}" ]; then
      cp gpu-check-out/*.txt gpu-check-out/*.json gpu-check-out/serve.log "$OUT/" 2>/dev/null || true
    fi
    exit $status
    ;;
  *)
    sed -n '2,13p' "$0" >&2
    exit 2
    ;;
esac
