#!/usr/bin/env bash
# scripts/gpu/ as a GPU machine without GStreamer runs it, with the three faults of its first run:
#  1. build.sh's own arguments (-j 16 TARGET) leaked into env.sh, which took -j for its .deb folder;
#  2. the .debs lacked the gloo headers (ProcessGroupGloo.hpp) and sentencepiece;
#  3. env.sh never unpacked again once unpacked, so a .deb added later was missing.
#   gpu_scripts.sh fake|real
# fake: two tiny .debs made here (1 and 3). real: fetch-debs.sh's own list from Debian's archive,
# unpacked privately, and `meson setup` of build.sh against the venv's pip LibTorch with
# pkg-config limited to the private prefix (2): needs the torch2 venv ($PYTHON) and the network.
set -euo pipefail
src=${VIDEOTRAIN_SOURCE_DIR:?}
mode=${1:?fake or real}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

mkdeb() {  # mkdeb NAME FILE: a package holding usr/share/vt-gpu-test/FILE
  local d=$tmp/pkg-$1
  mkdir -p "$d/DEBIAN" "$d/usr/share/vt-gpu-test"
  printf 'Package: %s\nVersion: 1.0\nArchitecture: all\nMaintainer: test <t@example.org>\nDescription: test\n' "$1" >"$d/DEBIAN/control"
  echo "$1" >"$d/usr/share/vt-gpu-test/$2"
  dpkg-deb --build -Zgzip "$d" "$tmp/debs/$1.deb" >/dev/null
}

if [[ $mode == fake ]]; then
  mkdir -p "$tmp/debs"
  mkdeb vt-one one
  mkdeb vt-two two
  export VT_GPU_ROOT=$tmp/root
  # 1: sourced with a build's arguments still set, as build.sh did.
  (cd "$tmp" && set -- -j 16 tools/videotrain-model && VT_GPU_DEBS=$tmp/debs source "$src/scripts/gpu/env.sh") \
    >"$tmp/out1" 2>&1 || { cat "$tmp/out1"; fail "env.sh failed when sourced with build arguments set"; }
  grep -q "unknown option" "$tmp/out1" && { cat "$tmp/out1"; fail "env.sh took a build argument for its .deb folder"; }
  [[ -f $VT_GPU_ROOT/usr/share/vt-gpu-test/one && -f $VT_GPU_ROOT/usr/share/vt-gpu-test/two ]] \
    || fail "env.sh did not unpack the .debs of VT_GPU_DEBS"
  echo "ok: arguments of the sourcing script are not taken for the .deb folder"
  # ... and build.sh itself, with ninja arguments (stops after sourcing: no GStreamer in fake debs).
  out=$(cd "$src" && VT_GPU_DEBS=$tmp/debs VT_GPU_BUILD=$tmp/build bash scripts/gpu/build.sh -j 16 tools/videotrain-model 2>&1 || true)
  grep -q "unknown option" <<<"$out" && { echo "$out"; fail "build.sh passed its arguments to env.sh"; }
  echo "ok: build.sh -j 16 TARGET does not reach dpkg"
  # 3: a .deb added after the first unpack is unpacked by the next source.
  mkdeb vt-three three
  (cd "$tmp" && VT_GPU_DEBS=$tmp/debs source "$src/scripts/gpu/env.sh") >/dev/null 2>&1 || fail "second source failed"
  [[ -f $VT_GPU_ROOT/usr/share/vt-gpu-test/three ]] || fail "a .deb added after the first unpack was not unpacked"
  echo "ok: a .deb added later is unpacked"
  # An empty folder is an error that names fetch-debs.sh, not a silent empty prefix.
  mkdir -p "$tmp/none"
  out=$(cd "$tmp" && VT_GPU_DEBS=$tmp/none bash -c "source '$src/scripts/gpu/env.sh'" 2>&1) && fail "an empty .deb folder passed"
  grep -q "fetch-debs.sh" <<<"$out" || { echo "$out"; fail "the empty-folder error does not name fetch-debs.sh"; }
  echo "ok: an empty .deb folder is refused"
  exit 0
fi

# real
py=${PYTHON:?}
if [[ ${VIDEOTRAIN_TORCH2:-0} != 1 ]]; then
  echo "SKIP: needs the torch2 venv's pip torch and its headers (bash scripts/torch2.sh test runs it)"
  exit 77
fi
if ! "$py" -c 'import torch, os, sys; sys.exit(0 if os.path.isdir(os.path.join(os.path.dirname(torch.__file__), "include")) else 1)' 2>/dev/null; then
  if [[ ${VIDEOTRAIN_TORCH2:-0} == 1 ]]; then fail "$py has no torch with headers"; fi
  echo "SKIP: needs a pip torch with its headers (the torch2 venv: bash scripts/torch2.sh test)"
  exit 77
fi
mkdir -p "$tmp/repo"
# fetch-debs.sh works in the tree it lives in: a copy of the scripts it reads.
cp -r "$src/scripts" "$tmp/repo/"
(cd "$tmp/repo" && git init -q . && VT_FETCH_DIFFUSERS=0 bash scripts/gpu/fetch-debs.sh "$tmp/debs") >"$tmp/fetch.log" 2>&1 \
  || { tail -20 "$tmp/fetch.log"; fail "fetch-debs.sh failed"; }
export VT_GPU_ROOT=$tmp/root
(export PATH=$(dirname "$py"):$PATH; source "$src/scripts/gpu/env.sh" "$tmp/debs"
 [[ -f $VT_GPU_ROOT/usr/include/gloo/algorithm.h ]] || fail "the .debs lack the gloo headers (libgloo-dev)"
 echo "ok: gloo headers unpacked"
 for pc in gstreamer-1.0 gstreamer-video-1.0 gstreamer-app-1.0 gstreamer-pbutils-1.0 sentencepiece nlohmann_json gtest; do
   "$PKG_CONFIG" --exists "$pc" || fail "pkg-config finds no $pc in the private prefix: fetch-debs.sh lacks its package"
 done
 echo "ok: pkg-config finds GStreamer, sentencepiece, nlohmann_json and gtest in the private prefix") || exit 1
# build.sh's own meson setup against the pip LibTorch, with its ninja arguments.
(cd "$src" && PATH=$(dirname "$py"):$PATH VT_GPU_DEBS=$tmp/debs VT_GPU_BUILD=$tmp/build VT_GPU_SETUP_ONLY=1 \
   bash scripts/gpu/build.sh -j 16 tools/videotrain-model) >"$tmp/setup.log" 2>&1 \
  || { tail -30 "$tmp/setup.log"; fail "scripts/gpu/build.sh's meson setup failed"; }
grep -E "LibTorch .*CUDA on, NCCL on" "$tmp/setup.log" || { tail -30 "$tmp/setup.log"; fail "setup did not turn CUDA and NCCL on"; }
echo "ok: scripts/gpu/build.sh configures against the pip LibTorch with CUDA and NCCL"
