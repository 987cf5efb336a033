#!/usr/bin/env bash
# videotrain-run --config (docs/run-config.md):
#  - a Wan LoRA config on tiny data (a CSV manifest repeated twice plus a folder of videos with
#    .txt captions) builds the expected pipeline (--dry-run) and the expected merged manifest;
#  - run for real it trains 2 steps, writes the checkpoint, the LoRA, and saves pipeline.txt
#    (the printed pipeline) and config.toml beside the checkpoints; with ranks = 2 it runs them
#    through videotrain-launch;
#  - unknown table, unknown key, bad value, a value out of range, missing files, a folder video
#    without its caption, conflicting dataset sizes: exit 2 at once with FILE:LINE and the reason;
#  - a CogVideoX folder gets train-cogvideox.pipeline's recipe, a [validator] folder its val.csv;
#  - examples/configs/wan-lora.toml passes --dry-run over stand-in folders of its layout.
set -euo pipefail
build=${VIDEOTRAIN_BUILD_DIR:?}
src=${VIDEOTRAIN_SOURCE_DIR:?}
ref=${VIDEOTRAIN_REFERENCE_DIR:?}
run="$build/tools/videotrain-run"
work=$(mktemp -d "${TMPDIR:-/tmp}/videotrain-run-config-XXXXXX")
trap 'rm -rf "$work"' EXIT
export GST_PLUGIN_PATH="$build/plugins/videotrain"
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; [[ -f $work/log ]] && cat "$work/log"; exit 1; }
cd "$work"
bash "$src/scripts/make_dataset.sh" data 6 >/dev/null
bash "$src/scripts/make_tiny_wan.sh" dit --latent-channels 4 --text-dim 32 --seed 3 --build "$build" >/dev/null
mkdir clips
cp data/videos/clip001.mp4 data/videos/clip002.mp4 clips/
printf 'a white ball, from a folder\n' > clips/clip001.txt
printf '  "quoted", with a comma  \n' > clips/clip002.txt

cat > run.toml <<EOF
# A tiny Wan LoRA
[run]
output = "out"

[model]
transformer = "dit"
vae = "$ref/wan_vae/tiny_wan21"
text-encoder = "$ref/text_encoder/umt5_tiny"

[[dataset]]
manifest = "data/train.csv"
repeats = 2
buckets = ["32x32"]
frame-buckets = [5]
fps = 0
num-frames = 5
width = 32
height = 32

[[dataset]]
folder = "clips"

[vaeencoder]
latent = "mode"

[textencoder]
max-length = 16
caption-dropout = 0

[microbatcher]
batch-size = 2
micro-batch-size = 1

[trainer]
lora-rank = 4
lora-alpha = 4
lr = 1e-3
max-steps = 2
timestep-sampling = "logit-normal"
checkpoint-every = 2
seed = 1
timeout = 120
EOF
"$run" --config run.toml --dry-run > "$work/log" 2>&1 || fail "--dry-run of a good config"
[[ ! -e out ]] || fail "--dry-run wrote the run's folder"
cat > expected <<EOF
# built by videotrain-run --config $work/run.toml
csvvideosrc location=$work/out/train.csv buckets=32x32 frame-buckets=5 fps=0 num-frames=5 width=32 height=32 num-epochs=0 prefetch=2 seed=1 \\
  ! vaeencoder model=$ref/wan_vae/tiny_wan21 latent=mode \\
  ! textencoder tokenizer=$ref/text_encoder/umt5_tiny model=$ref/text_encoder/umt5_tiny max-length=16 caption-dropout=0 \\
  ! queue max-size-buffers=16 \\
  ! microbatcher batch-size=2 micro-batch-size=1 \\
  ! ddptrainsink name=trainer model=$work/dit lr=1e-3 max-steps=2 gradient-checkpointing=true flow-shift=3.0 timestep-sampling=logit-normal save-dtype=bf16 checkpoint-every=2 checkpoint-dir=$work/out log-every=1 metrics-file=$work/out/metrics.jsonl lora-rank=4 lora-alpha=4 seed=1 timeout=120
EOF
grep -v '^videotrain-run:' "$work/log" > printed
diff expected printed || fail "the dry run's pipeline differs from the expected one (above)"
grep -q "videotrain-run: train.csv: 6 videos of $work/data/train.csv x 2 repeats" "$work/log" || fail "no note of the repeated manifest"
grep -q "videotrain-run: train.csv: 2 videos of folder clips" "$work/log" || fail "no note of the folder dataset"
echo "ok: --dry-run prints the expected pipeline"

# For real: 2 steps, then what is beside the checkpoints.
timeout 300 "$run" --config run.toml > "$work/log" 2>&1 || fail "the run from run.toml did not finish"
[[ -f out/step-00000002/manifest.json ]] || fail "no checkpoint of step 2"
[[ -f out/lora/pytorch_lora_weights.safetensors ]] || fail "no LoRA exported"
diff expected out/pipeline.txt || fail "pipeline.txt is not the printed pipeline"
cmp run.toml out/config.toml || fail "config.toml is not the config"
grep -q "pipeline saved as $work/out/pipeline.txt" "$work/log" || fail "the saved pipeline is not named"
# The merged manifest: the CSV's rows twice (paths made absolute, sizes kept), then the folder's.
/usr/bin/python3 - "$work" <<'PY' || fail "the merged manifest"
import csv, os, sys
w = sys.argv[1]
src = list(csv.DictReader(open(f"{w}/data/train.csv")))
rows = list(csv.DictReader(open(f"{w}/out/train.csv")))
assert len(rows) == 2 * len(src) + 2, (len(rows), len(src))
for k, r in enumerate(rows[:2 * len(src)]):
    s = src[k % len(src)]
    assert r["path"] == os.path.join(w, "data", s["path"]), (r, s)
    assert (r["text"], r["num_frames"], r["height"], r["width"]) == (s["text"], s["num_frames"], s["height"], s["width"]), (r, s)
assert rows[-2] == {"path": f"{w}/clips/clip001.mp4", "text": "a white ball, from a folder", "num_frames": "",
                    "height": "", "width": "", "fps": ""}, rows[-2]
assert rows[-1]["text"] == '"quoted", with a comma', rows[-1]
print(f"merged manifest: {len(rows)} rows")
PY
steps=$(grep -cE '"type": ?"step"' out/metrics.jsonl || true)
[[ $steps -ge 2 ]] || fail "metrics.jsonl holds $steps steps"
echo "ok: the config trained 2 steps; pipeline.txt, config.toml, train.csv and the LoRA are in out/"

# ranks = 2: videotrain-launch runs the saved pipeline.txt on 2 local ranks.
sed 's#^output = "out"#output = "out2"\nranks = 2#' run.toml > run2.toml
timeout 300 "$run" --config run2.toml > "$work/log" 2>&1 || fail "the 2-rank run from run2.toml did not finish"
grep -q "videotrain-launch -n 2 -f $work/out2/pipeline.txt" "$work/log" || fail "no launch line"
grep -q "videotrain-launch: 2 ranks finished" "$work/log" || fail "the launcher did not run 2 ranks"
[[ -f out2/step-00000002/manifest.json ]] || fail "no checkpoint of step 2 from the 2-rank run"
echo "ok: ranks = 2 ran through videotrain-launch"

# Errors: exit 2 within 30 s, FILE:LINE and the reason.
expect_error() {  # NAME MESSAGE: run bad.toml
  local rc=0
  timeout -s KILL 30 "$run" --config bad.toml --dry-run > "$work/log" 2>&1 || rc=$?
  [[ $rc -eq 2 ]] || fail "$1: status $rc, not 2"
  grep -qF -- "$2" "$work/log" || fail "$1: no '$2' in the output"
  echo "ok: $1: $(tail -1 "$work/log")"
}
head -9 run.toml > head.toml  # [run], [model]: lines 1-9; what bad() adds starts at line 10
bad() { { cat head.toml; printf '%s\n' "$@"; } > bad.toml; }
bad '[[dataset]]' 'manifest = "data/train.csv"' '[trainer]' 'lora-rnak = 4'
expect_error "unknown key" "bad.toml:13: 'lora-rnak' in [trainer] is not a property of ddptrainsink (did you mean 'lora-rank'?)"
bad '[[dataset]]' 'manifest = "data/train.csv"' '[trainr]' 'lr = 1e-3'
expect_error "unknown table" "bad.toml:12: unknown table [trainr] (did you mean 'trainer'?)"
bad '[[dataset]]' 'manifest = "data/train.csv"' 'repeat = 2'
expect_error "unknown dataset key" "bad.toml:12: unknown key 'repeat' in [[dataset]] (did you mean 'repeats'?)"
bad '[[dataset]]' 'manifest = "data/train.csv"' '[trainer]' 'timestep-sampling = "logit_normal"'
expect_error "bad enum value" "bad.toml:13: 'timestep-sampling' in [trainer]: \"logit_normal\" is not a value of ddptrainsink's timestep-sampling (one of "
bad '[[dataset]]' 'manifest = "data/train.csv"' '[trainer]' 'lora-rank = -3'
expect_error "value out of range" "bad.toml:13: 'lora-rank' in [trainer]: -3 is not a value of ddptrainsink's lora-rank (an integer from 0 to"
bad '[[dataset]]' 'manifest = "data/train.csv"' '[trainer]' 'lr = 1e-3 1e-4'
expect_error "TOML syntax" "bad.toml:13: unexpected '1' after the value"
bad '[[dataset]]' 'manifest = "data/nope.csv"'
expect_error "missing manifest" "bad.toml:11: 'manifest': $work/data/nope.csv does not exist"
bad '[[dataset]]' 'folder = "data/videos"'
expect_error "video without caption" "bad.toml:11: 'folder': $work/data/videos/clip000.mp4 has no caption file clip000.txt"
sed 's#^transformer = .*#transformer = "no-such-dit"#' head.toml > h2.toml && mv h2.toml head.toml
bad '[[dataset]]' 'manifest = "data/train.csv"'
expect_error "missing model folder" "bad.toml:6: 'transformer': $work/no-such-dit does not exist"
head -9 run.toml > head.toml
bad '[[dataset]]' 'manifest = "data/train.csv"' 'width = 32' '[[dataset]]' 'folder = "clips"' 'width = 64'
expect_error "datasets of different sizes" "bad.toml:15: 'width' = 64 differs from line 12"
bad '[[dataset]]' 'manifest = "data/train.csv"' '[trainer]' 'checkpoint-dir = "x"'
expect_error "a key the config sets" "bad.toml:13: 'checkpoint-dir' in [trainer] is set by the config itself: [run] output"

# A CogVideoX folder takes pipelines/train-cogvideox.pipeline's recipe (the class is read from its
# config.json; --dry-run loads no weights), and a [validator] folder of videos becomes OUTPUT/val.csv.
mkdir cog && printf '{"_class_name": "CogVideoXTransformer3DModel"}\n' > cog/config.json
cat > cog.toml <<EOF
[run]
output = "cog-out"
[model]
transformer = "cog"
vae = "$ref/cogvideox_vae/tiny_a"
text-encoder = "$ref/text_encoder/t5_v11_tiny"
[[dataset]]
manifest = "data/train.csv"
[validator]
folder = "clips"
every = 5
EOF
"$run" --config cog.toml --dry-run > "$work/log" 2>&1 || fail "--dry-run of a CogVideoX config"
for want in "csvvideosrc location=$work/data/train.csv buckets=\"720x480,480x720\" frame-buckets=49 fps=8 num-frames=49 width=720 height=480 num-epochs=0" \
    "max-length=226 caption-dropout=0.0" "csvvideosrc location=$work/cog-out/val.csv num-epochs=0 shuffle=false clip-start=center num-frames=49 width=720 height=480 fps=8 prefetch=1" \
    "! ddpvalsink trainer=trainer every=5"; do
  grep -qF -- "$want" "$work/log" || fail "the CogVideoX pipeline lacks '$want'"
done
! grep -q "flow-shift" "$work/log" || fail "a CogVideoX pipeline got Wan's flow-shift"
echo "ok: a CogVideoX config takes its recipe; a validation folder becomes val.csv"

# Wan 2.2 A14B in one job: [model] transformer-2 becomes ddptrainsink model-2, resolved like the others.
mkdir -p a14b && ln -s "$work/dit" a14b/transformer && ln -s "$work/dit" a14b/transformer_2
cat > a14b.toml <<EOF
[run]
output = "a14b-out"
[model]
transformer = "a14b/transformer"
transformer-2 = "a14b/transformer_2"
vae = "$ref/wan_vae/tiny_wan21"
text-encoder = "$ref/text_encoder/umt5_tiny"
[[dataset]]
manifest = "data/train.csv"
EOF
"$run" --config a14b.toml --dry-run > "$work/log" 2>&1 || fail "--dry-run of an A14B config"
grep -qF -- "model=$work/a14b/transformer " "$work/log" && grep -qF -- "model-2=$work/a14b/transformer_2 " "$work/log" \
  || fail "[model] transformer-2 did not become model-2"
echo "ok: [model] transformer-2 becomes ddptrainsink model-2"

# The example: its layout made of stand-ins (tiny model, the test data), then --dry-run.
mkdir -p ex/Wan2.1-T2V-1.3B-Diffusers ex/my-data
ln -s "$work/dit" ex/Wan2.1-T2V-1.3B-Diffusers/transformer
ln -s "$ref/wan_vae/tiny_wan21" ex/Wan2.1-T2V-1.3B-Diffusers/vae
ln -s "$ref/text_encoder/umt5_tiny" ex/Wan2.1-T2V-1.3B-Diffusers/text_encoder
ln -s "$ref/text_encoder/umt5_tiny" ex/Wan2.1-T2V-1.3B-Diffusers/tokenizer
cp data/train.csv data/val.csv ex/my-data/ && ln -s "$work/data/videos" ex/my-data/videos
cp -r clips ex/my-data/extra-clips
printf 'a red car\n' > ex/my-data/prompts.txt
cp "$src/examples/configs/wan-lora.toml" ex/
"$run" --config ex/wan-lora.toml --dry-run > "$work/log" 2>&1 || fail "examples/configs/wan-lora.toml does not pass --dry-run"
for want in "lora-rank=32" "optimizer=prodigy" "lr=1.0" "timestep-sampling=logit-normal" "ema-decay=0.999 export-ema=true" \
    "! ddpvalsink trainer=trainer every=250 weights=ema" \
    "! ddpsampler trainer=trainer every=250 at-start=true steps=30 guidance=5.0 num-frames=81 width=832 height=480 flow-shift=3.0 weights=ema" "samplesink trainer=trainer location=$work/ex/runs/wan-lora/samples/step-%08d/prompt-%02d.mp4"; do
  grep -qF -- "$want" "$work/log" || fail "the example's pipeline lacks '$want'"
done
echo "ok: examples/configs/wan-lora.toml passes --dry-run"
