#!/usr/bin/env bash
# Installs the Debian (bookworm) packages gst-videotrain needs, if any are missing.
# Usage: scripts/deps.sh [--bench] [--fuzz] [--torch2]   (--bench adds what the benchmarks compare
# against, --fuzz clang's libFuzzer for scripts/fuzz.sh, --torch2 the venv of scripts/torch2.sh)
set -euo pipefail
pkgs=(g++ pkg-config meson ninja-build openmpi-bin python3-gi gir1.2-gstreamer-1.0
      libgstreamer1.0-dev libgstreamer-plugins-base1.0-dev gstreamer1.0-tools
      gstreamer1.0-plugins-base gstreamer1.0-plugins-good gstreamer1.0-plugins-bad gstreamer1.0-libav
      libtorch-dev libgloo-dev nlohmann-json3-dev libgtest-dev libgmock-dev python3-torch
      libopenblas0-pthread)  # libtorch-dev alone computes with the reference BLAS
pkgs+=(googletest)  # its sources: tests/subprojects builds the gtest wrap offline from them
pkgs+=(libsentencepiece-dev python3-sentencepiece)  # textencoder's tokenizer; the tests' reference
pkgs+=(gobject-introspection libgirepository1.0-dev)  # the GstVideoTrain-1.0 typelib of the public library
pkgs+=(ffmpeg python3-numpy)  # csvvideosrc's decode-reference test makes its videos and references with them
for arg in "$@"; do
  case $arg in
    --bench) pkgs+=(python3-torchvision python3-av time) ;;
    --fuzz) pkgs+=(clang) ;;
    --torch2) pkgs+=(python3-venv python3-pip) ;;  # scripts/torch2.sh: .venv-torch2 over Debian's python3
    *) ;;  # build.sh passes its arguments on
  esac
done
missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]} == 0)); then
  exit 0
fi
echo "Installing: ${missing[*]}"
sudo=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
