#!/usr/bin/env bash
# Whole pipeline, 2 ranks, plain pipeline strings: a run stopped at step S and resumed with
# resume=true (nothing else changed) reaches step 2S with the same losses as an uninterrupted
# run; the checkpoint carries every rank's data position to csvvideosrc through the resume query.
set -euo pipefail
build=${VIDEOTRAIN_BUILD_DIR:?}
src=${VIDEOTRAIN_SOURCE_DIR:?}
work=$(mktemp -d "${TMPDIR:-/tmp}/videotrain-resume-XXXXXX")
trap 'rm -rf "$work"' EXIT
export GST_PLUGIN_PATH="$build/plugins/videotrain"
bash "$src/scripts/make_dataset.sh" "$work/data" 6 >/dev/null
"$build/elements/vaeencoder/videotrain-make-vae" "$work/vae" --seed 3 --tiny >/dev/null
half=3
run() {  # run NAME MAX_STEPS RESUME
  "$build/tools/videotrain-launch" -n 2 -q -- gst-launch-1.0 -q \
    csvvideosrc location="$work/data/train.csv" num-frames=5 width=32 height=32 num-epochs=0 prefetch=1 seed=5 ! \
    vaeencoder model="$work/vae" ! queue ! microbatcher batch-size=2 micro-batch-size=1 ! \
    ddptrainsink model=builtin:tiny-unet3d seed=9 max-steps="$2" resume="$3" log-every=1 \
      checkpoint-dir="$work/$1" checkpoint-every=100 metrics-file="$work/$1.jsonl" timeout=60 \
    > "$work/$1.log" 2>&1 || { cat "$work/$1.log"; echo "run $1 failed"; exit 1; }
}
run full $((2 * half)) false
run part "$half" false
run part $((2 * half)) true
/usr/bin/python3 - "$work/full.jsonl" "$work/part.jsonl" "$half" <<'PY'
import json, sys
def losses(path):
    out = {}
    for line in open(path):
        r = json.loads(line)
        if r.get("type", "step") == "step" and "loss" in r:
            out[r["step"]] = r["loss"]
    return out
full, part, half = losses(sys.argv[1]), losses(sys.argv[2]), int(sys.argv[3])
assert sorted(full) == list(range(1, 2 * half + 1)), f"uninterrupted steps: {sorted(full)}"
assert sorted(part) == list(range(1, 2 * half + 1)), f"stopped + resumed steps: {sorted(part)}"
bad = [(s, full[s], part[s]) for s in full if abs(full[s] - part[s]) > 1e-5 * max(1.0, abs(full[s]))]
assert not bad, f"losses differ after resume (step, uninterrupted, resumed): {bad}"
print(f"resume: steps {half + 1}..{2 * half} repeat the uninterrupted run's losses")
print("1 passed, 0 failed")
PY
ls "$work/part" | grep -q "step-0*$((2 * half))" || { echo "no final checkpoint"; exit 1; }
