#!/usr/bin/env bash
# Builds the project on a GPU machine against its pip LibTorch (CUDA, NCCL) into
# build-gpu/, with the GStreamer of scripts/gpu/env.sh. Extra arguments go to ninja.
#   bash scripts/gpu/build.sh [ninja args]
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/env.sh
site=$(dirname "$VT_TORCH_PREFIX")
extra=()
for d in /usr/local/cuda/include "$site"/nvidia/*/include "$site"/nvidia/cu*/include; do
  [[ -d $d ]] && extra+=("$d")
done
inc=$(IFS=,; echo "${extra[*]}")
if [[ ! -f build-gpu/build.ninja ]]; then
  meson setup build-gpu -Dtorch_prefix="$VT_TORCH_PREFIX" -Dcuda=enabled \
    -Dtorch_extra_includes="$inc" -Dtest_python="$VT_PYTHON"
fi
ninja -C build-gpu "$@"
