#!/usr/bin/env bash
# Builds the project on a GPU machine without GStreamer against its pip LibTorch (CUDA,
# NCCL) into build-gpu/, with the GStreamer of scripts/gpu/env.sh (the .debs of
# scripts/gpu/fetch-debs.sh in $VT_GPU_DEBS, default .gpu). Extra arguments go to ninja.
#   bash scripts/gpu/build.sh [ninja args]
# VT_GPU_SETUP_ONLY=1 stops after `meson setup` (tests/scripts/gpu_scripts.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/env.sh "${VT_GPU_DEBS:-.gpu}"
site=$(dirname "$VT_TORCH_PREFIX")
# The wheel keeps the CUDA headers apart (site-packages/nvidia) and has no gloo headers,
# which ProcessGroupGloo.hpp includes: those come from the unpacked libgloo-dev.
extra=()
for d in "$site"/nvidia/cu*/include "$site"/nvidia/*/include /usr/local/cuda/include "$VT_GPU_ROOT/usr/include"; do
  [[ -d $d ]] && extra+=("$d")
done
inc=$(IFS=,; echo "${extra[*]}")
# LibTorch from 2.10 on needs C++20 (meson.build checks).
std=c++17
grep -q 'C++20 or later' "$VT_TORCH_PREFIX/include/ATen/ATen.h" 2>/dev/null && std=c++20
build=${VT_GPU_BUILD:-build-gpu}
if [[ ! -f $build/build.ninja ]]; then
  meson setup "$build" -Dcpp_std=$std -Dtorch_prefix="$VT_TORCH_PREFIX" -Dcuda=enabled -Dnccl=enabled \
    -Dtorch_extra_includes="$inc" -Dtest_python="$VT_PYTHON"
fi
[[ ${VT_GPU_SETUP_ONLY:-0} == 1 ]] && exit 0
ninja -C "$build" "$@"
