#!/usr/bin/env bash
# Tee taps with default queues on real pipelines (issue 14, item 8): csvvideosrc ! vaeencoder
# ! tee, one branch training and one a fakesink, beside a validation source whose tee feeds a
# ddpvalsink and a fakesink. Latents carry their clips' durations, so each default queue
# (1 s) holds one or two of them; before the trainer and validation sinks stopped prerolling,
# start-up never left PAUSED. Runs under videotrain-run and gst-launch-1.0, each with a guard.
set -euo pipefail
build=${VIDEOTRAIN_BUILD_DIR:?}
src=${VIDEOTRAIN_SOURCE_DIR:?}
work=$(mktemp -d "${TMPDIR:-/tmp}/videotrain-taps-XXXXXX")
trap 'rm -rf "$work"' EXIT
export GST_PLUGIN_PATH="$build/plugins/videotrain"
bash "$src/scripts/make_dataset.sh" "$work/data" 6 >/dev/null
"$build/tools/videotrain-make-vae" "$work/vae" --seed 3 --tiny >/dev/null

# 9 frames at 8 fps: each latent spans 1.1 s, more than a default queue holds.
clip="num-frames=9 width=32 height=32"
pipeline() {  # pipeline METRICS
  echo "csvvideosrc location=$work/data/train.csv $clip num-epochs=0 rank=0 world-size=1 \
    ! vaeencoder model=$work/vae ! tee name=t \
    t. ! queue ! microbatcher batch-size=4 micro-batch-size=2 \
       ! ddptrainsink name=trainer model=builtin:tiny-unet3d max-steps=4 log-every=1 rank=0 world-size=1 metrics-file=$1 \
    t. ! queue ! fakesink sync=false \
    csvvideosrc location=$work/data/val.csv $clip num-epochs=0 shuffle=false prefetch=1 rank=0 world-size=1 \
    ! vaeencoder model=$work/vae latent=mode ! tee name=v \
    v. ! queue ! ddpvalsink trainer=trainer every=2 \
    v. ! queue ! fakesink sync=false"
}
check() {  # check NAME RC: exit 0, 4 steps, validation at steps 2 and 4
  local name=$1 rc=$2 metrics=$work/$1.jsonl
  (( rc == 0 )) || { cat "$work/$name.log"; echo "$name: exit $rc (124: hung)"; exit 1; }
  local steps vals
  steps=$(grep -c '"type":"step"' "$metrics" || true)
  vals=$(grep -c '"type":"validation"' "$metrics" || true)
  [[ $steps == 4 ]] || { cat "$work/$name.log" "$metrics"; echo "$name: $steps steps, expected 4"; exit 1; }
  (( vals >= 2 )) || { cat "$work/$name.log" "$metrics"; echo "$name: $vals validation results, expected 2"; exit 1; }
  echo "$name: 4 steps, $vals validation results"
}

rc=0
timeout -k 10 120 "$build/tools/videotrain-run" $(pipeline "$work/run.jsonl") > "$work/run.log" 2>&1 || rc=$?
check run $rc
rc=0
# shellcheck disable=SC2046
timeout -k 10 120 gst-launch-1.0 -e $(pipeline "$work/launch.jsonl") > "$work/launch.log" 2>&1 || rc=$?
check launch $rc
