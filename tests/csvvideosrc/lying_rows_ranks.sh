#!/usr/bin/env bash
# Issues 27/28 on 2 ranks through the real chain (csvvideosrc ! vaeencoder ! microbatcher !
# ddptrainsink): a row whose manifest says 50 frames holds 20. Only the rank that decodes it
# knows; the trainers relay the row facts through their c10d store before each epoch, so both
# ranks move it from the 41-frame bucket to the 9-frame one from epoch 1 (each rank's source
# logs the facts it agreed), and the run ends on both ranks.
set -euo pipefail
build=${VIDEOTRAIN_BUILD_DIR:?}
py=${PYTHON:-/usr/bin/python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/videotrain-liar-XXXXXX")
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
export GST_PLUGIN_PATH="$build/plugins/videotrain"
video() {  # name frames
  gst-launch-1.0 -q videotestsrc num-buffers="$2" ! video/x-raw,format=I420,width=48,height=32,framerate=10/1 \
    ! openh264enc gop-size=10 ! h264parse ! mp4mux ! filesink location="$work/$1.mp4" >/dev/null 2>&1
}
video liar 20
video long 45
video short 10
printf 'path,text,num_frames\nliar.mp4,liar,50\nlong.mp4,long,45\nshort.mp4,short,10\nlong.mp4,long2,45\n' > "$work/m.csv"
"$build/tools/videotrain-make-vae" "$work/vae" --seed 3 --tiny >/dev/null
port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
for rank in 0 1; do
  GST_DEBUG=csvvideosrc:5 GST_DEBUG_NO_COLOR=1 \
  RANK=$rank LOCAL_RANK=$rank WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 240 gst-launch-1.0 \
    csvvideosrc location="$work/m.csv" width=32 height=32 frame-buckets=41,9 num-epochs=3 prefetch=2 seed=5 \
    ! vaeencoder model="$work/vae" ! queue ! microbatcher batch-size=1 \
    ! ddptrainsink model=builtin:tiny-unet3d log-every=1 timeout=60 metrics-file="$work/metrics$rank.jsonl" \
    > "$work/rank$rank.log" 2> "$work/rank$rank.debug" &  # apart: the debug log would split stdout's lines
  pids+=($!)
done
for i in 0 1; do
  wait "${pids[$i]}" || { tail -20 "$work"/rank*.log; grep -h "WARN\|ERROR" "$work"/rank*.debug | tail -20; echo "rank $i failed"; exit 1; }
done
pids=()
[ -z "${KEEP_LOGS:-}" ] || cp "$work"/rank*.log "$work"/rank*.debug "$KEEP_LOGS"/
fail=0
for rank in 0 1; do
  for epoch in 1 2; do
    if ! grep -q "epoch $epoch: 1 row facts agreed" "$work/rank$rank.debug"; then
      echo "rank $rank did not agree on the liar's fact before epoch $epoch:"
      grep "row facts" "$work/rank$rank.debug" || true
      fail=1
    fi
  done
done
if ! cat "$work"/rank*.log | grep -q "Manifest row 0 changed: the manifest says 50 frames but its video stream has 20.*too short for its bucket 32x32x41, it moves to bucket 32x32x9 from epoch 1"; then
  echo "no rank said the liar moves:"; grep -h "liar" "$work"/rank*.log | head
  fail=1
fi
if grep -h "stays there\|could not agree" "$work"/rank*.log "$work"/rank*.debug; then fail=1; fi
steps0=$(grep -c '"type": *"step"\|"type":"step"' "$work/metrics0.jsonl" || true)
echo "rank 0 logged $steps0 steps"
[ "$fail" = 0 ] || { echo "0 passed, 1 failed"; exit 1; }
echo "both ranks agreed on the liar's frame count before epochs 1 and 2 and moved it from epoch 1"
echo "1 passed, 0 failed"
