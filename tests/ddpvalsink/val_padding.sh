#!/usr/bin/env bash
# The real validation chain (csvvideosrc ! vaeencoder ! tee ! 2 ddpvalsinks) on 2 ranks
# over 3 validation videos: csvvideosrc pads rank 1's shard with a repeated clip, which
# must not count, so the final validation reports samples=3.
set -euo pipefail
build=${VIDEOTRAIN_BUILD_DIR:?}
py=${PYTHON:-/usr/bin/python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/videotrain-valpad-XXXXXX")
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
export GST_PLUGIN_PATH="$build/plugins/videotrain"
echo "path,text" > "$work/val.csv"
for p in smpte ball snow; do
  gst-launch-1.0 -q videotestsrc num-buffers=12 pattern=$p ! video/x-raw,format=I420,width=48,height=32,framerate=8/1 \
    ! openh264enc gop-size=8 ! h264parse ! mp4mux ! filesink location="$work/$p.mp4" >/dev/null 2>&1
  echo "$p.mp4,\"a $p pattern\"" >> "$work/val.csv"
done
cp "$work/val.csv" "$work/train.csv"
"$build/tools/videotrain-make-vae" "$work/vae" --seed 3 --tiny >/dev/null
port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
for rank in 0 1; do
  RANK=$rank LOCAL_RANK=$rank WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 120 gst-launch-1.0 -q \
    csvvideosrc location="$work/train.csv" num-frames=5 width=32 height=32 num-epochs=0 prefetch=1 \
    ! vaeencoder model="$work/vae" ! queue ! microbatcher batch-size=2 micro-batch-size=1 \
    ! ddptrainsink name=trainer model=builtin:tiny-unet3d max-steps=2 log-every=1 timeout=60 \
      metrics-file="$work/metrics$rank.jsonl" \
    csvvideosrc location="$work/val.csv" num-epochs=0 shuffle=false clip-start=center num-frames=5 width=32 \
      height=32 prefetch=1 \
    ! vaeencoder model="$work/vae" latent=mode ! tee name=v \
    v. ! queue ! ddpvalsink trainer=trainer every=0 num-shards=2 shard-index=0 \
    v. ! queue ! ddpvalsink trainer=trainer every=0 num-shards=2 shard-index=1 \
    > "$work/rank$rank.log" 2>&1 &
  pids+=($!)
done
for i in 0 1; do
  wait "${pids[$i]}" || { cat "$work"/rank*.log; echo "rank $i failed"; exit 1; }
done
pids=()
"$py" - "$work/metrics0.jsonl" <<'PY'
import json, sys
vals = [r for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "validation"]
assert [(v["step"], v["samples"]) for v in vals] == [(2, 3)], f"validations (step, samples): {vals}"
print("validation of step 2 over 3 samples (rank 1's padding clip left out)")
print("1 passed, 0 failed")
PY
