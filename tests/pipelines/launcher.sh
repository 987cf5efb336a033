#!/usr/bin/env bash
# videotrain-launch as users run it (-f pipelines/train.pipeline, 2 ranks):
#  - Ctrl-C (SIGINT to the launcher) becomes EOS on every rank: exit 130 (stopped, not finished) and a final
#    checkpoint of the last step, written although checkpoint-every never came due;
#  - a rank that dies (SIGKILL) stops the others: non-zero exit, no rank left behind;
#  - without a TTY, output lines carry [rank N] and every rank's ddptrainsink-step messages become
#    plain progress lines (step, loss, samples/s), under videotrain-run (-f) and under
#    gst-launch-1.0 -m, whose lines read 'Got message #N from element "..." (element): ...'.
set -euo pipefail
build=${VIDEOTRAIN_BUILD_DIR:?}
src=${VIDEOTRAIN_SOURCE_DIR:?}
py=${PYTHON:-/usr/bin/python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/videotrain-launcher-XXXXXX")
launcher_pid=
cleanup() { [[ -n $launcher_pid ]] && kill -9 "$launcher_pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
export GST_PLUGIN_PATH="$build/plugins/videotrain"
bash "$src/scripts/make_dataset.sh" "$work/data" 6 >/dev/null
"$build/tools/videotrain-make-vae" "$work/vae" --seed 3 --tiny >/dev/null
launch() {  # launch NAME: starts the launcher in the background
  "$build/tools/videotrain-launch" -n 2 -f "$src/pipelines/train.pipeline" -D DATA="$work/data" -D VAE="$work/vae" \
    -D FRAMES=5 -D WIDTH=32 -D HEIGHT=32 -D BATCH=2 -D MICRO=1 -D STEPS=0 -D EPOCHS=0 -D CKPT="$work/$1" \
    -D CKPT_EVERY=100000 -D METRICS="$work/$1.jsonl" > "$work/$1.log" 2>&1 &
  launcher_pid=$!
}
steps_logged() { [[ -f $1 ]] && grep -c '"type":"step"' "$1" || echo 0; }
wait_steps() {  # wait_steps FILE N: until N steps are logged (60 s at most)
  for _ in $(seq 600); do
    (( $(steps_logged "$1") >= $2 )) && return 0
    kill -0 "$launcher_pid" 2>/dev/null || { cat "$work"/*.log; echo "launcher ended early"; exit 1; }
    sleep 0.1
  done
  cat "$work"/*.log; echo "no $2 steps within 60 s"; exit 1
}
wait_exit() {  # wait_exit SECONDS: sets rc to the launcher's exit status; fails on a hang
  for _ in $(seq $(($1 * 10))); do
    if ! kill -0 "$launcher_pid" 2>/dev/null; then
      rc=0
      wait "$launcher_pid" || rc=$?
      launcher_pid=
      return 0
    fi
    sleep 0.1
  done
  cat "$work"/*.log; echo "the launcher hung"; exit 1
}

check_output() {  # check_output LOG WHAT: rank prefixes and progress lines, no terminal codes
  local log=$1 what=$2
  grep -q '^\[rank 0\] ' "$log" || { cat "$log"; echo "$what: no [rank 0] lines"; exit 1; }
  grep -q '^\[rank 1\] ' "$log" || { cat "$log"; echo "$what: no [rank 1] lines"; exit 1; }
  grep -Eq '^\[rank 0\] step [1-9][0-9]* .*\| loss [0-9.]+ .*\| samples/s [0-9.]+' "$log" ||
    { cat "$log"; echo "$what: no progress line with step, loss and samples/s"; exit 1; }
  ! grep -q $'\r' "$log" || { cat "$log"; echo "$what: carriage returns without a TTY"; exit 1; }
  ! grep -q 'ddptrainsink-step' "$log" ||
    { cat "$log"; echo "$what: step messages printed raw instead of as progress"; exit 1; }
  grep -Eq '^\[rank 1\] step [1-9][0-9]* .*\| loss [0-9.]+ .*\| samples/s [0-9.]+' "$log" ||
    { cat "$log"; echo "$what: rank 1 printed no readable progress line"; exit 1; }
}

# 1. Ctrl-C: EOS, final checkpoint, exit 130.
launch int
wait_steps "$work/int.jsonl" 3
kill -INT "$launcher_pid"
wait_exit 90
[[ $rc == 130 ]] || { cat "$work/int.log"; echo "Ctrl-C: exit status $rc, expected 130"; exit 1; }
last=$("$py" -c 'import json,sys; print(max(json.loads(l)["step"] for l in open(sys.argv[1]) if "\"step\"" in l and json.loads(l).get("type") == "step"))' "$work/int.jsonl")
ckpt=$(ls "$work/int" | grep '^step-' | tail -1)
[[ $ckpt == $(printf 'step-%08d' "$last") ]] || { cat "$work/int.log"; echo "final checkpoint '$ckpt', last step $last"; exit 1; }
echo "Ctrl-C: EOS after step $last, final checkpoint $ckpt"
check_output "$work/int.log" "videotrain-run -f"
echo "videotrain-run -f: [rank N] prefixes and progress lines"

# 2. A rank dies: the others are stopped, non-zero exit.
launch kill
wait_steps "$work/kill.jsonl" 2
rank1=$(pgrep -f -P "$launcher_pid" . | sed -n 2p)
[[ -n $rank1 ]] || { echo "no rank 1 process"; exit 1; }
kill -9 "$rank1"
wait_exit 90
[[ $rc != 0 ]] || { cat "$work/kill.log"; echo "a dead rank gave exit status 0"; exit 1; }
grep -q "rank 1 exited" "$work/kill.log" || { cat "$work/kill.log"; echo "no word of rank 1"; exit 1; }
pgrep -f "$work/kill" >/dev/null && { echo "ranks left running"; exit 1; }
echo "dead rank 1: launcher exit status $rc, no rank left"

# 3. The gst-launch-1.0 -m form under the launcher: same prefixes and progress lines.
"$build/tools/videotrain-launch" -n 2 -- gst-launch-1.0 -m \
  csvvideosrc location="$work/data/train.csv" num-frames=5 width=32 height=32 num-epochs=0 prefetch=1 ! \
  vaeencoder model="$work/vae" ! queue ! microbatcher batch-size=2 micro-batch-size=1 ! \
  ddptrainsink model=builtin:tiny-unet3d max-steps=3 log-every=1 checkpoint-dir="$work/gst" timeout=60 \
  > "$work/gst.log" 2>&1 || { cat "$work/gst.log"; echo "gst-launch-1.0 -m run failed"; exit 1; }
grep -q 'Got message #' "$work/gst.log" || { cat "$work/gst.log"; echo "gst-launch-1.0 printed no messages"; exit 1; }
check_output "$work/gst.log" "gst-launch-1.0 -m"
grep -Eq '^\[rank 0\] step 3 ' "$work/gst.log" || { cat "$work/gst.log"; echo "gst-launch-1.0 -m: no progress for step 3"; exit 1; }
echo "gst-launch-1.0 -m: [rank N] prefixes and progress lines"
echo "4 passed, 0 failed"
