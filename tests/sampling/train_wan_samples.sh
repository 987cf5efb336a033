#!/usr/bin/env bash
# Sample videos while training, as users run it: pipelines/train-wan-samples.pipeline on 2 ranks
# (tiny Wan DiT, tiny Wan 2.1 VAE, the tiny umT5 encoder), 3 prompts sampled every 2 steps of 4 (at-start off),
# and a fourth too large to sample (a warning, once): each rank
# samples its share (prompt i on rank i mod 2) and samplesink writes 2 x 3 MP4s that ffprobe reads
# with the frame count and size each prompt asked for, and puts every rank's frames in TensorBoard
# (rank 1's under tensorboard-dir/samples-rank1); a bad prompt file and a sampler of another
# family are errors at start.
set -euo pipefail
build=${VIDEOTRAIN_BUILD_DIR:?}
src=${VIDEOTRAIN_SOURCE_DIR:?}
ref=${VIDEOTRAIN_REFERENCE_DIR:?}
work=$(mktemp -d "${TMPDIR:-/tmp}/videotrain-samples-XXXXXX")
trap 'rm -rf "$work"' EXIT
export GST_PLUGIN_PATH="$build/plugins/videotrain"
export OMP_NUM_THREADS=1
bash "$src/scripts/make_dataset.sh" "$work/data" 8 >/dev/null
bash "$src/scripts/make_tiny_wan.sh" "$work/dit" --latent-channels 4 --text-dim 32 --seed 3 --build "$build" >/dev/null
cat > "$work/prompts.csv" <<'CSV'
prompt,negative_prompt,seed,num_frames,width,height
a red ball rolling on grass,blurry,7,5,32,32
"a cat, walking",,8,9,64,32
waves on a beach,,,5,32,48
a huge one,,,99997,16384,16384
CSV
run() {  # run NAME PROMPTS [SAMPLER]
  timeout 300 "$build/tools/videotrain-launch" -n 2 -f "$src/pipelines/train-wan-samples.pipeline" \
    -D DATA="$work/data" -D VAE="$ref/wan_vae/tiny_wan21" -D TOKENIZER="$ref/text_encoder/umt5_tiny" \
    -D TEXT_ENCODER="$ref/text_encoder/umt5_tiny" -D MAX_LENGTH=16 -D BUCKETS=32x32 -D FRAME_BUCKETS=5 -D FPS=0 \
    -D FRAMES=5 -D WIDTH=32 -D HEIGHT=32 -D PREFETCH=1 -D BATCH=2 -D MICRO=1 -D STEPS=4 -D MODEL="$work/dit" \
    -D CKPT="$work/ckpt-$1" -D CKPT_EVERY=100 -D LR=1e-3 -D SEED=1 -D LATENT=mode -D CAPTION_DROPOUT=0 \
    -D METRICS="$work/$1.jsonl" -D TIMEOUT=120 -D PROMPTS="$2" -D SAMPLE_EVERY=2 -D SAMPLE_AT_START=false \
    -D SAMPLE_STEPS=3 -D SAMPLE_FPS=8 -D SAMPLES="$work/samples-$1" -D SAMPLER="${3:-auto}" \
    -D EXTRA="tensorboard-dir=$work/tb-$1" > "$work/$1.log" 2>&1
}
run ok "$work/prompts.csv" || { cat "$work/ok.log"; echo "FAIL: the run with a sample branch did not end"; exit 1; }
n=$(grep -c "\] sample of step [0-9]*, prompt" "$work/ok.log" || true)
[ "$n" = 6 ] || { cat "$work/ok.log"; echo "FAIL: $n ddpsampler-sample messages, expected 6 (2 steps x 3 prompts)"; exit 1; }
expect() {  # expect STEP PROMPT FRAMES WIDTH HEIGHT
  local f
  f="$work/samples-ok/step-$(printf %08d "$1")/prompt-$(printf %02d "$2").mp4"
  [ -s "$f" ] || { ls -R "$work/samples-ok" || true; echo "FAIL: no $f"; exit 1; }
  got=$(ffprobe -v error -count_frames -select_streams v:0 -show_entries stream=nb_read_frames,width,height \
    -of csv=p=0 "$f")
  [ "$got" = "$4,$5,$3" ] || { echo "FAIL: $f has width,height,frames $got, expected $4,$5,$3"; exit 1; }
}
for step in 2 4; do
  expect $step 0 5 32 32
  expect $step 1 9 64 32
  expect $step 2 5 32 48
done
files=$(find "$work/samples-ok" -name '*.mp4' | wc -l)
[ "$files" = 6 ] || { echo "FAIL: $files files, expected 6"; exit 1; }
# Prompt 1 on rank 1 and prompts 0, 2 on rank 0: the rank-prefixed messages say who sampled what.
grep -q "\[rank 1\] sample of step 2, prompt 1 " "$work/ok.log" ||
  { grep "sample of step" "$work/ok.log"; echo "FAIL: prompt 1 was not sampled on rank 1"; exit 1; }
if grep -q "training waits" "$work/ok.log"; then echo "FAIL: training waited for sampling"; exit 1; fi
# Prompt 3 asks for 99997x16384x16384 (a terabyte of latents): refused before allocating, said once.
n=$(grep -c "prompt 3: 99997 frames of 16384x16384 are 26214400000 video tokens, over max-tokens=" "$work/ok.log" || true)
[ "$n" = 1 ] || { grep "prompt 3" "$work/ok.log"; echo "FAIL: $n warnings for the huge prompt, expected 1"; exit 1; }
echo "samples: 6 MP4s (2 steps x 3 prompts over 2 ranks) with the frames and sizes the prompt file asked for"
# samplesink trainer=trainer: rank 0's samples (prompts 0 and 2) as PNG images in the trainer's events,
# rank 1's (prompt 1, 9 frames: 0, 4, 8) in an events file of its own under samples-rank1, images only.
/usr/bin/python3 - "$work/tb-ok" <<'PY'
import glob, sys
def events(folder, tags, want, who):
    files = glob.glob(folder + "/events.out.tfevents.*")
    assert len(files) == 1, f"{len(files)} events files in {folder}, expected 1 ({who})"
    data = open(files[0], "rb").read()
    missing = [t for t in tags if t.encode() not in data]
    assert not missing, f"no TensorBoard image for {missing} ({who})"
    pngs = data.count(b"\x89PNG\r\n\x1a\n")
    assert pngs >= want, f"{pngs} PNG images, fewer than {want} ({who})"
    print(f"samples: {pngs} PNG frames in {who}'s TensorBoard events")
    return data
tag = "samples/prompt-{:02d}/frame-{:03d}".format
rank0 = events(sys.argv[1], [tag(p, f) for p in (0, 2) for f in (0, 2, 4)], 12, "rank 0")
assert tag(1, 0).encode() not in rank0, "prompt 1 (rank 1's) in rank 0's events"
rank1 = events(sys.argv[1] + "/samples-rank1", [tag(1, f) for f in (0, 4, 8)], 6, "rank 1")
assert b"train/loss" not in rank1, "rank 1's events repeat the step scalars"
PY
printf 'prompt,seed\nfine,1\nbad,12x\n' > "$work/bad.csv"
if run bad "$work/bad.csv"; then echo "FAIL: a bad prompt file did not stop the run"; exit 1; fi
grep -q "line 3: seed '12x'" "$work/bad.log" || { cat "$work/bad.log"; echo "FAIL: the error does not name the line"; exit 1; }
echo "samples: a bad prompt file is an error naming its line"
if run family "$work/prompts.csv" ddim; then echo "FAIL: a CogVideoX sampler on a Wan model did not stop the run"; exit 1; fi
grep -q "sampler=ddim is CogVideoX's but the trainer's model is wan" "$work/family.log" ||
  { cat "$work/family.log"; echo "FAIL: the sampler/model mismatch is not named"; exit 1; }
[ ! -d "$work/ckpt-family/step-00000002" ] || { echo "FAIL: the mismatch was found only after training began"; exit 1; }
echo "samples: a sampler of another family is an error at start naming it"
# A VAE of another model after the sampler (Wan 2.2's 8 latent channels for a 4-channel model): an
# error at start naming both, not at the first sample.
if timeout 300 "$build/tools/videotrain-launch" -n 1 -f "$src/pipelines/train-wan.pipeline" \
    -D DATA="$work/data" -D VAE="$ref/wan_vae/tiny_wan21" -D TOKENIZER="$ref/text_encoder/umt5_tiny" \
    -D TEXT_ENCODER="$ref/text_encoder/umt5_tiny" -D MAX_LENGTH=16 -D BUCKETS=32x32 -D FRAME_BUCKETS=5 -D FPS=0 \
    -D FRAMES=5 -D WIDTH=32 -D HEIGHT=32 -D PREFETCH=1 -D BATCH=2 -D MICRO=1 -D STEPS=4 -D MODEL="$work/dit" \
    -D CKPT="$work/ckpt-vae" -D CKPT_EVERY=100 -D LR=1e-3 -D SEED=1 -D LATENT=mode -D CAPTION_DROPOUT=0 \
    -D METRICS="$work/vae.jsonl" -D TIMEOUT=120 -D EXTRA="promptsrc location=$work/prompts.csv ! textencoder \
tokenizer=$ref/text_encoder/umt5_tiny model=$ref/text_encoder/umt5_tiny max-length=16 caption-dropout=0 ! \
ddpsampler trainer=trainer every=2 steps=2 ! queue ! vaedecoder model=$ref/wan_vae/tiny_wan22 ! fakesink" \
    > "$work/vae.log" 2>&1; then
  echo "FAIL: a VAE of another model after the sampler did not stop the run"; exit 1
fi
grep -q "takes 8 latent channels but the trainer's model makes 4" "$work/vae.log" ||
  { cat "$work/vae.log"; echo "FAIL: the VAE/model mismatch is not named"; exit 1; }
grep -q '"loss"' "$work/vae.jsonl" 2>/dev/null && { echo "FAIL: the mismatch was found only after training began"; exit 1; }
echo "samples: a vaedecoder of another model's VAE is an error at start naming both"
