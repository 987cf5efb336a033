#!/usr/bin/env bash
# Whole pipeline, one rank, plain gst-launch-1.0: checkpoints at steps 2 and 4, NaN bytes poked
# into step 4's weights (length unchanged); resume=true warns on the bus naming step-00000004,
# resumes from step 2 (metrics: steps 3..6 follow), keeps step 2 until newer ones verify, and
# replaces step 4. Then an unwritable checkpoint-dir fails at start, naming the folder.
set -euo pipefail
build=${VIDEOTRAIN_BUILD_DIR:?}
src=${VIDEOTRAIN_SOURCE_DIR:?}
work=$(mktemp -d "${TMPDIR:-/tmp}/videotrain-ckpt-XXXXXX")
trap 'rm -rf "$work"' EXIT
export GST_PLUGIN_PATH="$build/plugins/videotrain"
bash "$src/scripts/make_dataset.sh" "$work/data" 4 >/dev/null
"$build/tools/videotrain-make-vae" "$work/vae" --seed 3 --tiny >/dev/null
run() {  # run LOG MAX_STEPS RESUME CHECKPOINT_DIR
  gst-launch-1.0 -e \
    csvvideosrc location="$work/data/train.csv" num-frames=5 width=32 height=32 num-epochs=0 prefetch=1 seed=5 ! \
    vaeencoder model="$work/vae" ! queue ! microbatcher batch-size=1 micro-batch-size=1 ! \
    ddptrainsink model=builtin:tiny-unet3d seed=9 max-steps="$2" resume="$3" log-every=1 rank=0 world-size=1 \
      checkpoint-dir="$4" checkpoint-every=2 keep-checkpoints=2 metrics-file="$work/runs/m.jsonl" \
    > "$work/$1.log" 2>&1
}
fail() { cat "$work"/*.log; echo "$*"; exit 1; }
run first 4 false "$work/ckpt" || fail "first run failed"
[[ -f $work/ckpt/step-00000004/manifest.json ]] || fail "no step-00000004/manifest.json"
/usr/bin/python3 - "$work/ckpt/step-00000004/model.safetensors" <<'PY'
import struct, sys
with open(sys.argv[1], "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    f.seek(8 + n)
    f.write(struct.pack("<f", float("nan")))
PY
run resumed 6 true "$work/ckpt" || fail "resumed run failed"
grep -q "WARNING.*skipping checkpoint '$work/ckpt/step-00000004'.*CRC-32" "$work/resumed.log" ||
  fail "no warning naming the damaged step-00000004"
/usr/bin/python3 - "$work/runs/m.jsonl" <<'PY'
import json, sys
steps = [r["step"] for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "step"]
assert steps == [1, 2, 3, 4, 3, 4, 5, 6], f"steps in the metrics file: {steps}"
PY
ls "$work/ckpt" > "$work/left.log"
[[ $(tr '\n' ' ' < "$work/left.log") == "step-00000004 step-00000006 " ]] || fail "checkpoints left: $(cat "$work/left.log")"
: > "$work/a-file"
if run unwritable 2 false "$work/a-file/ckpt"; then fail "an unwritable checkpoint-dir did not fail"; fi
grep -q "ERROR.*checkpoint-dir '$work/a-file/ckpt': Not a directory" "$work/unwritable.log" ||
  fail "no error naming the unwritable checkpoint-dir"
echo "checkpoints: resumed past a damaged step 4 from step 2; unwritable checkpoint-dir fails at start"
