#!/usr/bin/env bash
# Downloads (here, with network) the Debian bookworm packages that a GPU machine
# without GStreamer or network needs to build and test the project against its
# own pip LibTorch: scripts/gpu/build.sh unpacks them into a private prefix.
# Usage: bash scripts/gpu/fetch-debs.sh [DIR]   (default .gpu, git-ignored; VT_FETCH_DIFFUSERS=0
# leaves out the diffusers wheel)
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-.gpu}
mkdir -p "$dir"
mkdir -p .git/info
grep -qx "/$dir/" .git/info/exclude 2>/dev/null || echo "/$dir/" >>.git/info/exclude
pkgs=(
  # GStreamer runtime, headers and the plugins the tests use (videotestsrc, vp8, matroska)
  libgstreamer1.0-0 libgstreamer1.0-dev gstreamer1.0-tools
  libgstreamer-plugins-base1.0-0 libgstreamer-plugins-base1.0-dev
  gstreamer1.0-plugins-base gstreamer1.0-plugins-good
  libvpx7 liborc-0.4-0 libogg0 libvorbis0a libvorbisenc2 libtheora0 libopus0
  libunwind8 libdw1 libelf1 libcap2 libgudev-1.0-0 libcdparanoia0 libvisual-0.4-0
  libdv4 libpng16-16 libjpeg62-turbo libbz2-1.0
  libglib2.0-0 libglib2.0-dev libglib2.0-dev-bin
  # build and test tools
  pkgconf pkgconf-bin libpkgconf3 nlohmann-json3-dev libgtest-dev libgmock-dev
  # textencoder's tokenizer
  libsentencepiece0 libsentencepiece-dev
  # the gloo headers that LibTorch's ProcessGroupGloo.hpp includes (the pip wheel has none;
  # its libtorch_cpu holds gloo itself, so headers are all the build needs)
  libgloo-dev
)
(cd "$dir" && apt-get download "${pkgs[@]}")
# The benches' diffusers peer, for a GPU machine that has torch and transformers but neither
# diffusers nor network: the pure-Python wheel of the pinned release, imported from the file.
if [[ ${VT_FETCH_DIFFUSERS:-1} == 1 ]]; then
  pin=$(grep -E '^diffusers==' scripts/torch2-requirements.txt)
  py=python3
  [[ -x .venv-torch2/bin/python ]] && py=.venv-torch2/bin/python
  "$py" -m pip download --disable-pip-version-check -q --no-deps -d "$dir/python" "$pin"
fi
du -sh "$dir"
