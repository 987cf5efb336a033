#!/usr/bin/env bash
# Installs dependencies when missing, configures build/ once, and builds.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh "$@"
if [[ ! -f build/build.ninja ]]; then
  meson setup build
fi
ninja -C build
