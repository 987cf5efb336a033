#!/usr/bin/env bash
# A native CogVideoX transformer trained end to end as users run it: pipelines/train-cogvideox.pipeline
# (csvvideosrc ! vaeencoder (tiny CogVideoX VAE) ! textencoder ! queue ! microbatcher ! ddptrainsink
# model=<tiny CogVideoX-2b-layout DiT folder>), v-prediction on CogVideoX's DDPM schedule. Checks that
#  - 1 rank x batch 4 and 2 ranks x batch 2 train to the same weights (per-sample noise and timesteps),
#  - a run stopped at step 2 and resumed to 4 ends with the uninterrupted run's weights,
#  - the finished run exports a bf16 diffusers folder that videotrain-model and model= load again,
#  - a LoRA run exports files that videotrain-model applies (diffusers, ComfyUI and kohya naming alike),
#  - the 1.5 layout (temporal patches) trains on an odd latent frame count (padded in front),
#  - the 1.5-I2V layout trains on vaeencoder condition=first-frame (and says what to set without it).
set -euo pipefail
build=${VIDEOTRAIN_BUILD_DIR:?}
src=${VIDEOTRAIN_SOURCE_DIR:?}
ref=${VIDEOTRAIN_REFERENCE_DIR:?}
work=$(mktemp -d "${TMPDIR:-/tmp}/videotrain-cogvideox-XXXXXX")
trap 'rm -rf "$work"' EXIT
export GST_PLUGIN_PATH="$build/plugins/videotrain"
export OMP_NUM_THREADS=1
bash "$src/scripts/make_dataset.sh" "$work/data" 8 >/dev/null
/usr/bin/python3 "$src/scripts/make_text_encoder.py" "$work/text" --captions "$work/data/train.csv" >/dev/null 2>&1
bash "$src/scripts/make_tiny_cogvideox.sh" "$work/dit" --layout 2b --text-len 16 --sample 4x4 --seed 3 --build "$build" >/dev/null
bash "$src/scripts/make_tiny_cogvideox.sh" "$work/dit15" --layout 1.5 --text-len 16 --sample 4x4 --seed 3 --build "$build" >/dev/null
bash "$src/scripts/make_tiny_cogvideox.sh" "$work/dit15i2v" --layout 1.5-i2v --text-len 16 --sample 4x4 --seed 3 --build "$build" >/dev/null
run() {  # run NAME RANKS BATCH MICRO STEPS RESUME [MODEL [EXTRA ddptrainsink properties [FRAMES]]]
  timeout 300 "$build/tools/videotrain-launch" -n "$2" -q -f "$src/pipelines/train-cogvideox.pipeline" \
    -D DATA="$work/data" -D VAE="$ref/cogvideox_vae/tiny_a" -D TOKENIZER="$work/text/spiece.model" \
    -D TEXT_ENCODER="$work/text/text_encoder.pt" -D MAX_LENGTH=16 -D BUCKETS=32x32 -D FRAME_BUCKETS="${9:-5}" -D FPS=0 \
    -D FRAMES="${9:-5}" -D WIDTH=32 -D HEIGHT=32 -D PREFETCH=1 -D BATCH="$3" -D MICRO="$4" -D STEPS="$5" -D RESUME="$6" \
    -D MODEL="${7:-$work/dit}" -D CKPT="$work/ckpt-$1" -D CKPT_EVERY=2 -D LR=1e-3 -D SEED=1 -D LATENT=mode \
    -D METRICS="$work/$1.jsonl" -D TIMEOUT=120 -D EXTRA="${8:-}" -D CONDITION="${CONDITION:-none}" > "$work/$1.log" 2>&1
}
run one 1 4 2 4 false || { cat "$work/one.log"; echo "FAIL: the 1-rank CogVideoX run did not end"; exit 1; }
run two 2 2 1 4 false || { cat "$work/two.log"; echo "FAIL: the 2-rank CogVideoX run did not end"; exit 1; }
run res 1 4 2 2 false || { cat "$work/res.log"; echo "FAIL: the run to step 2 did not end"; exit 1; }
run res 1 4 2 4 true || { cat "$work/res.log"; echo "FAIL: the resumed run did not end"; exit 1; }
/usr/bin/python3 - "$work" <<'PY'
import json, math, struct, sys
import torch
w = sys.argv[1]
def weights(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n)); data = f.read()
    dt = {"F32": torch.float32, "BF16": torch.bfloat16}
    return {k: torch.frombuffer(bytearray(data[v["data_offsets"][0]:v["data_offsets"][1]]), dtype=dt[v["dtype"]]).reshape(v["shape"]).float()
            for k, v in h.items() if k != "__metadata__"}
ckpt = lambda run: weights(f"{w}/ckpt-{run}/step-00000004/diffusion_pytorch_model.safetensors")
base = weights(f"{w}/dit/diffusion_pytorch_model.safetensors")
one, two, res = ckpt("one"), ckpt("two"), ckpt("res")
assert sorted(one) == sorted(base) and any(k.startswith("transformer_blocks.1.attn1.norm_q") for k in one), sorted(one)[:5]
moved = max((one[k] - base[k]).abs().max().item() for k in base)
assert moved > 1e-4, f"training did not change the weights (max change {moved})"
flat = lambda ws: torch.cat([ws[k].flatten() for k in sorted(ws)])
d12 = ((flat(one) - flat(two)).norm() / flat(one).norm()).item()
# 1e-5, not Wan's 1e-6: the loss weight 1/(1 - a_t) reaches ~1e3 near t = 0, scaling the float rounding
# of the two summation orders (a sample drawn differently would differ by O(1)).
assert d12 < 1e-5, f"1 rank x 4 and 2 ranks x 2 differ: rel L2 {d12}"
dres = max((one[k] - res[k]).abs().max().item() for k in one)
assert dres == 0, f"the resumed run's weights differ from the uninterrupted run's by {dres}"
losses = [json.loads(l)["loss"] for l in open(f"{w}/one.jsonl") if '"loss"' in l and '"type": "validation"' not in l]
assert len(losses) >= 4 and all(math.isfinite(l) for l in losses), losses
ex = weights(f"{w}/ckpt-one/transformer/diffusion_pytorch_model.safetensors")
dex = max(((ex[k] - one[k]).norm() / one[k].norm().clamp_min(1e-12)).item() for k in one)
assert dex < 1e-2, f"the bf16 export is not the final weights (rel {dex})"
cfg = json.load(open(f"{w}/ckpt-one/transformer/config.json"))
assert cfg["_class_name"] == "CogVideoXTransformer3DModel" and cfg["max_text_seq_length"] == 16, cfg
print(f"cogvideox: weights moved {moved:.3g}; 1 vs 2 ranks rel L2 {d12:.2g}; resume identical; "
      f"export (bf16) rel {dex:.2g}; losses {[round(l, 3) for l in losses]}")
PY
"$build/tools/videotrain-model" info "$work/ckpt-one/transformer" | grep -q "stored BF16" || {
  echo "FAIL: the export is not a bf16 folder that videotrain-model reads"; exit 1; }
run again 1 4 2 1 false "$work/ckpt-one/transformer" || { cat "$work/again.log"; echo "FAIL: the exported folder does not train"; exit 1; }
echo "cogvideox: the exported folder trains again"
# LoRA with the default targets (to_q, to_k, to_v, to_out.0): exported in the diffusers naming (no loader
# reads CogVideoX LoRAs in the ComfyUI or kohya naming: lora-format=all is refused at start).
run lone 1 4 2 2 false "$work/dit" "lora-rank=4 lora-alpha=8 lora-format=diffusers" || {
  cat "$work/lone.log"; echo "FAIL: the LoRA run did not end"; exit 1; }
/usr/bin/python3 - "$work" <<'PY'
import json, os, struct, sys
import torch
w = sys.argv[1]
def keys(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return [k for k in json.loads(f.read(n)) if k != "__metadata__"]
d = keys(f"{w}/ckpt-lone/lora/pytorch_lora_weights.safetensors")
assert len(d) == 16 and all(k.startswith("transformer.transformer_blocks.") and ".attn1." in k for k in d), sorted(d)
g = torch.Generator().manual_seed(0)
t = {"hidden_states": torch.randn(1, 2, 4, 4, 4, generator=g), "timestep": torch.tensor([500]),
     "encoder_hidden_states": torch.randn(1, 16, 32, generator=g)}
header, blobs, off = {}, [], 0
for name, x in t.items():
    b = x.contiguous().numpy().tobytes()
    header[name] = {"dtype": "I64" if x.dtype == torch.int64 else "F32", "shape": list(x.shape), "data_offsets": [off, off + len(b)]}
    blobs.append(b); off += len(b)
h = json.dumps(header).encode()
open(f"{w}/in.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PY
for f in pytorch_lora_weights; do
  "$build/tools/videotrain-model" forward "$work/dit" "$work/in.safetensors" "$work/out-$f.safetensors" \
    --lora "$work/ckpt-lone/lora/$f.safetensors" > /dev/null || { echo "FAIL: forward --lora $f"; exit 1; }
done
"$build/tools/videotrain-model" forward "$work/dit" "$work/in.safetensors" "$work/out-base.safetensors" > /dev/null
if cmp -s "$work/out-pytorch_lora_weights.safetensors" "$work/out-base.safetensors"; then
  echo "FAIL: the LoRA changes nothing"; exit 1
fi
echo "cogvideox lora: 16 tensors on attn1.to_q/k/v/out.0 in the diffusers file, which changes the output"
# CogVideoX 1.5: 9 frames -> 3 latent frames, padded to 4 for patch_size_t 2.
run p15 1 4 2 2 false "$work/dit15" "" 9 || { cat "$work/p15.log"; echo "FAIL: the 1.5-layout run did not end"; exit 1; }
echo "cogvideox 1.5: trains on 3 latent frames (padded to 4)"
# CogVideoX1.5-I2V: the first frame's latents after the noisy ones (vaeencoder condition=first-frame).
CONDITION=first-frame run i2v 1 4 2 2 false "$work/dit15i2v" "" 9 || {
  cat "$work/i2v.log"; echo "FAIL: the 1.5-I2V run did not end"; exit 1; }
/usr/bin/python3 - "$work" <<'PY'
import json, math, sys
w = sys.argv[1]
losses = [json.loads(l)["loss"] for l in open(f"{w}/i2v.jsonl") if '"loss"' in l and '"type": "validation"' not in l]
assert len(losses) >= 2 and all(math.isfinite(l) for l in losses), losses
print(f"cogvideox 1.5-I2V: losses {[round(l, 3) for l in losses]}")
PY
if run i2vnone 1 4 2 1 false "$work/dit15i2v" "" 9; then echo "FAIL: the I2V folder trained without a condition"; exit 1; fi
grep -q "condition=first-frame" "$work/i2vnone.log" || { cat "$work/i2vnone.log"; echo "FAIL: no hint to set condition"; exit 1; }
echo "cogvideox 1.5-I2V: trains on condition=first-frame; without it the error says to set it"
echo "6 passed, 0 failed"
