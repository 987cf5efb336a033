#!/usr/bin/env bash
# videotrain-run and videotrain-launch on pipelines that cannot run, and on signals:
#  - unknown element, property typo, syntax error, plugin not found (GST_PLUGIN_PATH unset,
#    an empty registry), a pipeline whose start fails: a non-zero exit at once with the
#    parser's (or the element's) message, not a warning and a hang;
#  - SIGTERM ends a running videotrain-run (EOS, exit 143: stopped by a signal, not finished);
#    a second SIGTERM, or no EOS within --eos-timeout, aborts it with a non-zero status, and what
#    the trainer posts while stopping (its rescue checkpoint) is still printed;
#  - a 2-rank training whose rank 1 never starts: rank 0 says every few seconds which rank it
#    waits for, and Ctrl-C ends it within 5 s (exit 130), not after the rendezvous timeout;
#  - videotrain-cache prune with a size it cannot read says what is wrong with it;
#  - --print-clips prints the caps again when they change (buckets);
#  - videotrain-launch exits non-zero when its ranks fail that way, and stops the rank
#    that was running fine when another one fails.
# "At once" is checked against a 30 s guard only: a hang, not slowness, fails.
set -uo pipefail
build=${VIDEOTRAIN_BUILD_DIR:?}
src=${VIDEOTRAIN_SOURCE_DIR:?}
run="$build/tools/videotrain-run"
launch="$build/tools/videotrain-launch"
work=$(mktemp -d "${TMPDIR:-/tmp}/videotrain-run-tools-XXXXXX")
bg=
cleanup() { [[ -n $bg ]] && kill -9 "$bg" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
export GST_PLUGIN_PATH="$build/plugins/videotrain"
fail() { echo "FAIL: $*"; [[ -f $work/out ]] && cat "$work/out"; exit 1; }

expect_fails() {  # expect_fails NAME MESSAGE COMMAND...: non-zero within 30 s, MESSAGE in the output
  local name=$1 msg=$2 rc=0
  shift 2
  timeout -s KILL 30 "$@" > "$work/out" 2>&1 || rc=$?
  [[ $rc -ne 137 ]] || fail "$name: still running after 30 s"
  [[ $rc -ne 0 ]] || fail "$name: exit status 0"
  grep -qF -- "$msg" "$work/out" || fail "$name: no '$msg' in the output"
  echo "ok: $name (status $rc)"
}

expect_fails "unknown element" 'no element "nosuchelement"' \
  "$run" videotestsrc num-buffers=3 ! nosuchelement ! fakesink
expect_fails "property typo" 'no property "nosuchprop"' \
  "$run" videotestsrc num-buffers=3 ! fakesink nosuchprop=1
expect_fails "syntax error" 'syntax error' \
  "$run" videotestsrc num-buffers=3 ! ! fakesink
mkdir -p "$work/empty"
expect_fails "no plugin path" 'no element "microbatcher"' \
  env -u GST_PLUGIN_PATH GST_REGISTRY="$work/empty/registry.bin" \
  "$run" videotestsrc num-buffers=3 ! microbatcher ! fakesink
grep -qF 'GST_PLUGIN_PATH is unset' "$work/out" || fail "no plugin path: no hint about GST_PLUGIN_PATH"
expect_fails "start fails" 'No such file' \
  "$run" filesrc location="$work/no-such-file" ! fakesink
expect_fails "launcher, bad pipeline" 'no property "nosuchprop"' \
  "$launch" -n 2 -- "$run" videotestsrc num-buffers=3 ! fakesink nosuchprop=1

# run_bg COMMAND...: in the background, output to $work/out, pid in $bg.
run_bg() { "$@" > "$work/out" 2>&1 & bg=$!; }
wait_text() {  # wait_text TEXT: until TEXT is in the output (30 s at most)
  for _ in $(seq 300); do grep -qF -- "$1" "$work/out" && return 0; sleep 0.1; done
  fail "no '$1' within 30 s"
}
wait_bg() {  # wait_bg NAME: sets rc to the background job's status; a hang fails
  for _ in $(seq 300); do
    if ! kill -0 "$bg" 2>/dev/null; then rc=0; wait "$bg" || rc=$?; bg=; return 0; fi
    sleep 0.1
  done
  fail "$1: still running 30 s after the signal"
}

# A running pipeline (the progress probe prints a line per frame once data flows).
run_bg "$run" --print-clips src videotestsrc name=src is-live=true ! fakesink
sleep 2
kill -TERM "$bg"
wait_bg "SIGTERM"
[[ $rc -eq 143 ]] || fail "SIGTERM: status $rc, wanted 143 (EOS, stopped by SIGTERM)"
grep -qF 'SIGTERM: sending EOS' "$work/out" || fail "SIGTERM: no EOS"
echo "ok: SIGTERM ends videotrain-run with EOS"

# A pipeline whose streaming thread is stuck for 100 s: EOS cannot get through.
stuck=(videotestsrc ! identity sleep-time=100000000 ! fakesink)
run_bg "$run" --eos-timeout 1 "${stuck[@]}"
sleep 2
kill -TERM "$bg"
wait_bg "no EOS"
[[ $rc -ne 0 ]] || fail "no EOS: status 0"
grep -qF 'no end of stream within 1 s' "$work/out" || fail "no EOS: no message about the deadline"
echo "ok: no EOS within --eos-timeout aborts (status $rc)"

run_bg "$run" "${stuck[@]}"
sleep 2
kill -TERM "$bg"
sleep 1
kill -TERM "$bg"
wait_bg "second SIGTERM"
[[ $rc -ne 0 ]] || fail "second SIGTERM: status 0"
echo "ok: a second SIGTERM aborts (status $rc)"

# Rank 1's pipeline is bad, rank 0's runs for ever: the launcher stops rank 0 too.
run_bg "$launch" -n 2 -- bash -c \
  '[[ $RANK == 1 ]] && set -- fakesink nosuchprop=1 || set -- fakesink; exec "$0" videotestsrc is-live=true ! "$@"' "$run"
wait_bg "launcher, one bad rank"
[[ $rc -ne 0 ]] || fail "launcher, one bad rank: status 0"
grep -qF 'rank 1 exited with status' "$work/out" || fail "launcher, one bad rank: rank 1's failure not reported"
echo "ok: launcher stops every rank when one fails (status $rc)"

mkdir -p "$work/cache"
expect_fails "cache prune, bad size" "--max-bytes '10Q' is not a size in bytes" \
  "$build/tools/videotrain-cache" prune "$work/cache" --max-bytes 10Q

# Training pipelines need data and a VAE.
bash "$src/scripts/make_dataset.sh" "$work/data" 4 >/dev/null
"$build/tools/videotrain-make-vae" "$work/vae" --seed 3 --tiny >/dev/null
train=(-D DATA="$work/data" -D VAE="$work/vae" -D FRAMES=5 -D WIDTH=32 -D HEIGHT=32 -D BATCH=2 -D MICRO=1
       -D STEPS=100000 -D CKPT="$work/ckpt" -D METRICS="$work/metrics.jsonl")

# Rank 1 never starts: rank 0 waits at rendezvous (timeout 20 s: a message every 5 s).
port=$((20000 + RANDOM % 20000))
run_bg env RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$run" -f "$src/pipelines/train.pipeline" \
  "${train[@]}" -D TIMEOUT=20
wait_text "rank 0 of 2 is waiting for rank 1 to join"
grep -qE 'gives up at [0-9]{2}:[0-9]{2}:[0-9]{2} \(in [0-9]+ s, timeout 20 s\)' "$work/out" ||
  fail "rendezvous: the waiting message does not say until when"
t0=$(date +%s%N)
kill -INT "$bg"
wait_bg "Ctrl-C at rendezvous"
took_ms=$((($(date +%s%N) - t0) / 1000000))
((took_ms < 5000)) || fail "Ctrl-C at rendezvous: took $took_ms ms (wanted < 5 s)"
[[ $rc -eq 130 ]] || fail "Ctrl-C at rendezvous: status $rc, wanted 130"
echo "ok: a rank that never comes is reported while waiting, and Ctrl-C ends the wait in $took_ms ms"

# EOS cannot get through (each buffer sleeps 2 s in identity, behind a full queue): --eos-timeout
# aborts, the trainer's stop writes a rescue checkpoint of its last step, and videotrain-run prints it.
slow="$work/slow.pipeline"
sed 's|! queue max-size-buffers=16|! queue max-size-buffers=16 ! identity sleep-time=2000000|' \
  "$src/pipelines/train.pipeline" > "$slow"
grep -q 'identity sleep-time' "$slow" || fail "could not make the slow pipeline"
rm -rf "$work/ckpt"
run_bg "$run" --eos-timeout 1 -f "$slow" "${train[@]}" -D CKPT_EVERY=100000
wait_text "step 1 | epoch"
kill -TERM "$bg"
wait_bg "rescue"
[[ $rc -ne 0 ]] || fail "rescue: status 0"
grep -qE 'rescue checkpoint of step [0-9]+ written: ' "$work/out" || fail "rescue: the rescue checkpoint is not on the screen"
grep -qF 'ERROR' "$work/out" && fail "rescue: an error was printed"
echo "ok: a rescue checkpoint written while stopping is printed (status $rc)"

# --print-clips with buckets: the caps change from clip to clip, and each change is printed.
out=$("$run" --print-clips src csvvideosrc name=src location="$work/data/train.csv" num-frames=5 width=32 height=32 \
  buckets=32x24,24x32 num-epochs=1 ! fakesink 2>&1) || { echo "$out"; fail "--print-clips with buckets"; }
caps=$(grep -c '^  caps: ' <<< "$out" || true)
((caps >= 2)) || { echo "$out"; fail "--print-clips: $caps caps lines for clips of two buckets"; }
echo "ok: --print-clips prints the caps of each clip whose caps changed ($caps lines)"

# -f: a default may hold another reference (${VAE:-${M}/vae}); -D wins over the default; an undefined
# reference inside a used default is an error naming it.
printf '%s\n' 'fakesrc num-buffers=1 sizetype=fixed sizemax=4 ! filesink location=${OUT:-${DIR}/x-${N:-1}.bin} # ${NOT_USED}' \
  > "$work/nested.pipeline"
"$run" -q -f "$work/nested.pipeline" -D DIR="$work" -D NOT_USED=y > "$work/out" 2>&1 || fail "nested defaults"
[[ -s $work/x-1.bin ]] || fail "nested defaults: ${DIR}/x-\${N:-1}.bin was not written"
"$run" -q -f "$work/nested.pipeline" -D DIR="$work" -D N=2 -D NOT_USED=y > "$work/out" 2>&1 && [[ -s $work/x-2.bin ]] \
  || fail "nested defaults: -D N=2 inside a default"
if "$run" -q -f "$work/nested.pipeline" -D NOT_USED=y > "$work/out" 2>&1; then fail "nested defaults: \${DIR} undefined ran"; fi
grep -qF '${DIR} is not defined' "$work/out" || fail "nested defaults: the error does not name \${DIR}"
echo "ok: pipeline files take defaults that name other definitions (\${VAE:-\${M}/vae})"
