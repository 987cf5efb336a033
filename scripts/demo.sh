#!/usr/bin/env bash
# The main job on a fresh Debian bookworm machine: installs what is missing, builds,
# makes a small dataset and streams it through csvvideosrc, printing every clip read.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
data=${DATA:-demo-data}
bash scripts/make_dataset.sh "$data" 12
export GST_PLUGIN_PATH="$PWD/build/plugins/videotrain${GST_PLUGIN_PATH:+:$GST_PLUGIN_PATH}"
build/tools/videotrain-run -f pipelines/stream.pipeline -D DATA="$data" --print-clips src
