#!/usr/bin/env bash
# Wan 2.2 A14B in one job: pipelines/train-wan.pipeline with model=PIPE/transformer (high-noise expert)
# and model-2=PIPE/transformer_2 (low-noise), two tiny Wan folders (seeds 3 and 4) and the boundary from
# PIPE/model_index.json (0.875, as Wan2.2-T2V-A14B's). Checks that
#  - both experts train (each sample's timestep picks one), 1 rank x batch 4 and 2 ranks x batch 2 end
#    with the same weights, a run stopped at step 2 and resumed to 4 ends bit for bit as the straight one,
#  - the run exports transformer/ and transformer_2/ (LoRA: lora/ and lora_2/), which videotrain-model
#    info reads, and `videotrain-model export` of the checkpoint-dir writes the same two folders,
#  - ddpsampler samples the two-expert trainer's weights (sample_latents_2), and a videotrain-run
#    config with [model] transformer-2 and a [validator] trains and validates them,
#  - timestep-range with model-2, and a pipeline folder without boundary_ratio, fail at start saying why.
set -euo pipefail
build=${VIDEOTRAIN_BUILD_DIR:?}
src=${VIDEOTRAIN_SOURCE_DIR:?}
ref=${VIDEOTRAIN_REFERENCE_DIR:?}
work=$(mktemp -d "${TMPDIR:-/tmp}/videotrain-a14b-XXXXXX")
trap 'rm -rf "$work"' EXIT
export GST_PLUGIN_PATH="$build/plugins/videotrain"
export OMP_NUM_THREADS=1
bash "$src/scripts/make_dataset.sh" "$work/data" 8 >/dev/null
for e in transformer:3 transformer_2:4; do
  bash "$src/scripts/make_tiny_wan.sh" "$work/pipe/${e%:*}" --latent-channels 4 --text-dim 32 --seed "${e#*:}" \
    --build "$build" >/dev/null
done
echo '{"_class_name": "WanPipeline", "boundary_ratio": 0.875}' > "$work/pipe/model_index.json"
run() {  # run NAME RANKS BATCH MICRO STEPS RESUME [EXTRA ddptrainsink properties]
  timeout 300 "$build/tools/videotrain-launch" -n "$2" -q -f "$src/pipelines/train-wan.pipeline" \
    -D DATA="$work/data" -D VAE="$ref/wan_vae/tiny_wan21" -D TOKENIZER="$ref/text_encoder/umt5_tiny" \
    -D TEXT_ENCODER="$ref/text_encoder/umt5_tiny" -D MAX_LENGTH=16 -D BUCKETS=32x32 -D FRAME_BUCKETS=5 -D FPS=0 \
    -D FRAMES=5 -D WIDTH=32 -D HEIGHT=32 -D PREFETCH=1 -D BATCH="$3" -D MICRO="$4" -D STEPS="$5" -D RESUME="$6" \
    -D MODEL="$work/pipe/transformer" -D CKPT="$work/ckpt-$1" -D CKPT_EVERY=2 -D LR=1e-3 -D SEED=1 -D LATENT=mode \
    -D CAPTION_DROPOUT=0 -D METRICS="$work/$1.jsonl" -D TIMEOUT=120 \
    -D EXTRA="model-2=$work/pipe/transformer_2 ${7:-}" > "$work/$1.log" 2>&1
}
run one 1 4 2 4 false || { cat "$work/one.log"; echo "FAIL: the 1-rank two-expert run did not end"; exit 1; }
run two 2 2 1 4 false || { cat "$work/two.log"; echo "FAIL: the 2-rank two-expert run did not end"; exit 1; }
run res 1 4 2 2 false || { cat "$work/res.log"; echo "FAIL: the run to step 2 did not end"; exit 1; }
run res 1 4 2 4 true || { cat "$work/res.log"; echo "FAIL: the resumed run did not end"; exit 1; }
"$build/tools/videotrain-model" export "$work/ckpt-one" "$work/exported/transformer" --dtype bf16 > "$work/export.log" \
  || { cat "$work/export.log"; echo "FAIL: export of the two-expert checkpoint-dir"; exit 1; }
/usr/bin/python3 - "$work" <<'PY'
import json, struct, sys
import torch
w = sys.argv[1]
def weights(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n)); data = f.read()
    dt = {"F32": torch.float32, "BF16": torch.bfloat16}
    return {k: torch.frombuffer(bytearray(data[v["data_offsets"][0]:v["data_offsets"][1]]), dtype=dt[v["dtype"]]).reshape(v["shape"]).float()
            for k, v in h.items() if k != "__metadata__"}
W = "diffusion_pytorch_model.safetensors"
flat = lambda ws: torch.cat([ws[k].flatten() for k in sorted(ws)])
state = json.load(open(f"{w}/ckpt-one/step-00000004/trainer.json"))
assert state["model_2"].endswith("transformer_2") and state["boundary_ratio"] == 0.875, state
files = json.load(open(f"{w}/ckpt-one/step-00000004/manifest.json"))["files"]
assert f"transformer_2/{W}" in files, sorted(files)  # the second expert is sealed with the checkpoint
for sub, name in (("", "transformer"), ("transformer_2/", "transformer_2")):
    base = weights(f"{w}/pipe/{name}/{W}")
    one, two, res = (weights(f"{w}/ckpt-{r}/step-00000004/{sub}{W}") for r in ("one", "two", "res"))
    moved = (flat(one) - flat(base)).abs().max().item()
    assert moved > 1e-4, f"{name} did not train (max change {moved})"
    d12 = ((flat(one) - flat(two)).norm() / flat(one).norm()).item()
    assert d12 < 1e-6, f"{name}: 1 rank x 4 and 2 ranks x 2 differ: rel L2 {d12}"
    assert torch.equal(flat(one), flat(res)), f"{name}: the resumed run differs from the uninterrupted one"
    ex = weights(f"{w}/ckpt-one/{name}/{W}")
    dex = ((flat(ex) - flat(one)).norm() / flat(one).norm()).item()
    assert dex < 1e-2, f"{name}: the bf16 export is not the final weights (rel {dex})"
    tool = weights(f"{w}/exported/{name}/{W}")
    assert torch.equal(flat(tool), flat(ex)), f"{name}: videotrain-model export differs from the run's export"
    print(f"a14b {name}: moved {moved:.3g}; 1 vs 2 ranks rel L2 {d12:.2g}; resume identical; export rel {dex:.2g}; "
          "videotrain-model export identical")
PY
for d in transformer transformer_2; do
  "$build/tools/videotrain-model" info "$work/ckpt-one/$d" | grep -q "stored BF16" || {
    echo "FAIL: the export $d is not a bf16 folder that videotrain-model reads"; exit 1; }
done
# LoRA on both experts with an EMA: lora/ and lora_2/ (lora_ema/ and lora_ema_2/), the checkpoint's
# adapters resume exactly, and `export --ema` of the checkpoint-dir gives the run's EMA exports.
lora="lora-rank=4 lora-alpha=8 ema-decay=0.9 export-ema=true"
run lone 1 4 2 4 false "$lora" || { cat "$work/lone.log"; echo "FAIL: the two-expert LoRA run did not end"; exit 1; }
run lres 1 4 2 2 false "$lora" || { cat "$work/lres.log"; echo "FAIL: the LoRA run to 2 did not end"; exit 1; }
run lres 1 4 2 4 true "$lora" || { cat "$work/lres.log"; echo "FAIL: the resumed LoRA run did not end"; exit 1; }
"$build/tools/videotrain-model" export "$work/ckpt-lone" "$work/exported/lora_ema" --ema > "$work/lexport.log" \
  || { cat "$work/lexport.log"; echo "FAIL: export --ema of the two-expert LoRA checkpoint-dir"; exit 1; }
for d in lora_ema lora_ema_2; do
  cmp "$work/ckpt-lone/$d/pytorch_lora_weights.safetensors" "$work/exported/$d/pytorch_lora_weights.safetensors" \
    || { echo "FAIL: export --ema's $d differs from the run's"; exit 1; }
done
for d in lora lora_2 lora_ema lora_ema_2; do
  "$build/tools/videotrain-model" info "$work/ckpt-lone/$d/pytorch_lora_weights.safetensors" | grep -q "rank: 4" || {
    echo "FAIL: $d is not a rank-4 LoRA file videotrain-model reads"; exit 1; }
done
/usr/bin/python3 - "$work" <<'PY'
import json, struct, sys
import torch
w = sys.argv[1]
def read(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n)); data = f.read()
    return {k: torch.frombuffer(bytearray(data[v["data_offsets"][0]:v["data_offsets"][1]]), dtype=torch.float32).reshape(v["shape"])
            for k, v in h.items() if k != "__metadata__"}
F = "pytorch_lora_weights.safetensors"
for sub in ("", "transformer_2/"):
    one, res = read(f"{w}/ckpt-lone/step-00000004/{sub}{F}"), read(f"{w}/ckpt-lres/step-00000004/{sub}{F}")
    assert any(v.abs().max() > 0 for k, v in one.items() if "lora_B" in k), f"{sub or 'transformer'}: lora_B did not train"
    assert all(torch.equal(one[k], res[k]) for k in one), f"{sub or 'transformer'}: the resumed LoRA differs"
    ema = read(f"{w}/ckpt-lone/{'lora_ema_2' if sub else 'lora_ema'}/{F}")
    d = max((ema[k] - one[k]).abs().max().item() for k in one)
    assert 0 < d, f"{sub or 'transformer'}: the EMA export equals the raw adapter"
print("a14b lora: both experts' adapters trained; resume identical; lora/, lora_2/, lora_ema/, lora_ema_2/ "
      "exported, export --ema of the checkpoint-dir gives the same EMA files")
PY
# ddpsampler on a two-expert trainer (train-wan-samples.pipeline): samples through both experts
# (diffusers-wan-experts checks that loop against WanPipeline) and samplesink writes the video.
printf 'prompt,negative_prompt,seed,num_frames,width,height\na red ball,,7,5,32,32\n' > "$work/prompts.csv"
timeout 300 "$build/tools/videotrain-launch" -n 1 -f "$src/pipelines/train-wan-samples.pipeline" \
  -D DATA="$work/data" -D VAE="$ref/wan_vae/tiny_wan21" -D TOKENIZER="$ref/text_encoder/umt5_tiny" \
  -D TEXT_ENCODER="$ref/text_encoder/umt5_tiny" -D MAX_LENGTH=16 -D BUCKETS=32x32 -D FRAME_BUCKETS=5 -D FPS=0 \
  -D FRAMES=5 -D WIDTH=32 -D HEIGHT=32 -D PREFETCH=1 -D BATCH=2 -D MICRO=1 -D STEPS=2 -D MODEL="$work/pipe/transformer" \
  -D CKPT="$work/ckpt-samples" -D CKPT_EVERY=100 -D LR=1e-3 -D SEED=1 -D LATENT=mode -D CAPTION_DROPOUT=0 \
  -D METRICS="$work/samples.jsonl" -D TIMEOUT=120 -D PROMPTS="$work/prompts.csv" -D SAMPLE_EVERY=2 \
  -D SAMPLE_AT_START=false -D SAMPLE_STEPS=4 -D SAMPLE_FPS=8 -D SAMPLES="$work/samples" \
  -D EXTRA="model-2=$work/pipe/transformer_2" > "$work/samples.log" 2>&1 \
  || { cat "$work/samples.log"; echo "FAIL: the two-expert run with a sample branch did not end"; exit 1; }
[ -s "$work/samples/step-00000002/prompt-00.mp4" ] || { cat "$work/samples.log"; echo "FAIL: no two-expert sample"; exit 1; }
echo "a14b: ddpsampler sampled the two-expert trainer's weights"
# videotrain-run --config with [model] transformer-2 and a [validator]: ddpvalsink validates the
# two-expert trainer's weights (each val sigma by its expert: test expert-pair). 2 steps: the
# validation branch may join after the trainer has ended, and then validates its final weights
# (ddpvalsink-engine AValidatorJoiningAFinishedTrainer...) instead of waiting for steps.
cat > "$work/a14b.toml" <<TOML
[run]
output = "$work/cfg-out"
[model]
transformer = "$work/pipe/transformer"
transformer-2 = "$work/pipe/transformer_2"
vae = "$ref/wan_vae/tiny_wan21"
text-encoder = "$ref/text_encoder/umt5_tiny"
[[dataset]]
manifest = "$work/data/train.csv"
buckets = ["32x32"]
frame-buckets = [5]
num-frames = 5
width = 32
height = 32
fps = 0
[validator]
manifest = "$work/data/train.csv"
every = 2
[textencoder]
max-length = 16
caption-dropout = 0.0
[microbatcher]
batch-size = 2
[trainer]
max-steps = 2
boundary-ratio = 0.875
TOML
timeout 120 "$build/tools/videotrain-run" --config "$work/a14b.toml" > "$work/cfg.log" 2>&1 \
  || { cat "$work/cfg.log"; echo "FAIL: the two-expert config run did not end"; exit 1; }
grep -q '"type":"validation"' "$work/cfg-out/metrics.jsonl" && grep -q "model-2=$work/pipe/transformer_2" "$work/cfg-out/pipeline.txt" \
  || { cat "$work/cfg.log"; echo "FAIL: no validation of the two-expert run from its config"; exit 1; }
echo "a14b: a config run with transformer-2 trains and ddpvalsink validates both experts' weights"
if run bad 1 4 2 1 false "timestep-range=875,1000"; then echo "FAIL: timestep-range with model-2 trained"; exit 1; fi
grep -q "the boundary splits the range" "$work/bad.log" || { cat "$work/bad.log"; echo "FAIL: no timestep-range error"; exit 1; }
rm "$work/pipe/model_index.json"
if run nob 1 4 2 1 false; then echo "FAIL: a run without a boundary trained"; exit 1; fi
grep -q "set boundary-ratio" "$work/nob.log" || { cat "$work/nob.log"; echo "FAIL: no boundary-ratio error"; exit 1; }
echo "a14b: timestep-range with model-2 and a missing boundary fail at start saying why"
echo "6 passed, 0 failed"
