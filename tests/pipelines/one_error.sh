#!/usr/bin/env bash
# One error per failure (issue 38 item 5), as gst-launch-1.0 shows it: a missing model folder, manifest
# or prompt file gives one "ERROR: from element" naming it, not the base class's "state change failed
# and some element failed to post a proper error message" after it.
set -euo pipefail
build=${VIDEOTRAIN_BUILD_DIR:?}
src=${VIDEOTRAIN_SOURCE_DIR:?}
work=$(mktemp -d "${TMPDIR:-/tmp}/videotrain-one-error-XXXXXX")
trap 'rm -rf "$work"' EXIT
export GST_PLUGIN_PATH="$build/plugins/videotrain"
bash "$src/scripts/make_dataset.sh" "$work/data" 2 >/dev/null
"$build/tools/videotrain-make-vae" "$work/vae" --seed 3 --tiny >/dev/null
failed=0 passed=0
check() {  # check NAME WHAT-THE-ERROR-NAMES PIPELINE...
  local name=$1 names=$2
  shift 2
  timeout 120 gst-launch-1.0 -e "$@" >"$work/$name.log" 2>&1 && { echo "FAIL $name: the pipeline ran"; failed=$((failed + 1)); return; }
  local n
  n=$(grep -c "^ERROR: from element" "$work/$name.log" || true)
  if [[ $n != 1 ]] || ! grep -q "^ERROR: from element.*$names" "$work/$name.log" \
     || grep -q "failed to post a proper error message\|Internal data stream error" "$work/$name.log"; then
    echo "FAIL $name: $n errors (want one naming '$names'):"
    cat "$work/$name.log"
    failed=$((failed + 1))
  else
    echo "ok $name: one error naming '$names'"
    passed=$((passed + 1))
  fi
}
shape="num-frames=5 width=32 height=32"
check trainer-model "/nowhere/transformer" csvvideosrc location="$work/data/train.csv" $shape ! \
  vaeencoder model="$work/vae" ! microbatcher batch-size=1 ! ddptrainsink model=/nowhere/transformer max-steps=1
check vae-model "/nowhere/vae" csvvideosrc location="$work/data/train.csv" $shape ! \
  vaeencoder model=/nowhere/vae ! microbatcher batch-size=1 ! fakesink
check manifest "/nowhere/train.csv" csvvideosrc location=/nowhere/train.csv $shape ! fakesink
check prompts "/nowhere/prompts.txt" promptsrc location=/nowhere/prompts.txt ! fakesink
echo "$passed passed, $failed failed"
((failed == 0))
