#!/usr/bin/env bash
# A native Wan transformer trained end to end as users run it: pipelines/train-wan.pipeline
# (csvvideosrc ! vaeencoder (tiny Wan 2.1 VAE) ! textencoder (native umT5 on the reference umt5_tiny
# folder, as model=text_encoder/ tokenizer=tokenizer/ of a published one) ! queue ! microbatcher !
# ddptrainsink model=<tiny Wan DiT folder>). Checks that
#  - 1 rank x batch 4 and 2 ranks x batch 2 train to the same weights (per-sample noise and sigmas),
#  - a run stopped at step 2 and resumed to 4 ends with the uninterrupted run's weights,
#  - the finished run exports a bf16 diffusers folder that videotrain-model and model= load again,
#  - a folder of another class is an error at start naming it.
set -euo pipefail
build=${VIDEOTRAIN_BUILD_DIR:?}
src=${VIDEOTRAIN_SOURCE_DIR:?}
ref=${VIDEOTRAIN_REFERENCE_DIR:?}
work=$(mktemp -d "${TMPDIR:-/tmp}/videotrain-wan-XXXXXX")
trap 'rm -rf "$work"' EXIT
export GST_PLUGIN_PATH="$build/plugins/videotrain"
export OMP_NUM_THREADS=1
bash "$src/scripts/make_dataset.sh" "$work/data" 8 >/dev/null
bash "$src/scripts/make_tiny_wan.sh" "$work/dit" --latent-channels 4 --text-dim 32 --seed 3 --build "$build" >/dev/null
run() {  # run NAME RANKS BATCH MICRO STEPS RESUME [MODEL [EXTRA ddptrainsink properties]]
  timeout 300 "$build/tools/videotrain-launch" -n "$2" -q -f "$src/pipelines/train-wan.pipeline" \
    -D DATA="$work/data" -D VAE="$ref/wan_vae/tiny_wan21" -D TOKENIZER="$ref/text_encoder/umt5_tiny" \
    -D TEXT_ENCODER="$ref/text_encoder/umt5_tiny" -D MAX_LENGTH=16 -D BUCKETS=32x32 -D FRAME_BUCKETS=5 -D FPS=0 \
    -D FRAMES=5 -D WIDTH=32 -D HEIGHT=32 -D PREFETCH=1 -D BATCH="$3" -D MICRO="$4" -D STEPS="$5" -D RESUME="$6" \
    -D MODEL="${7:-$work/dit}" -D CKPT="$work/ckpt-$1" -D CKPT_EVERY=2 -D LR=1e-3 -D SEED=1 -D LATENT=mode \
    -D CAPTION_DROPOUT=0 -D METRICS="$work/$1.jsonl" -D TIMEOUT=120 -D EXTRA="${8:-}" > "$work/$1.log" 2>&1
}
run one 1 4 2 4 false || { cat "$work/one.log"; echo "FAIL: the 1-rank Wan run did not end"; exit 1; }
run two 2 2 1 4 false || { cat "$work/two.log"; echo "FAIL: the 2-rank Wan run did not end"; exit 1; }
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
def ckpt(run):
    return weights(f"{w}/ckpt-{run}/step-00000004/diffusion_pytorch_model.safetensors")
base = weights(f"{w}/dit/diffusion_pytorch_model.safetensors")
one, two, res = ckpt("one"), ckpt("two"), ckpt("res")
moved = max((one[k] - base[k]).abs().max().item() for k in base)
assert moved > 1e-4, f"training did not change the weights (max change {moved})"
# Over all weights (AdamW turns float rounding of near-zero gradients into steps of up to lr).
flat = lambda ws: torch.cat([ws[k].flatten() for k in sorted(ws)])
d12 = ((flat(one) - flat(two)).norm() / flat(one).norm()).item()
assert d12 < 1e-6, f"1 rank x 4 and 2 ranks x 2 differ: rel L2 {d12}"
dres = max((one[k] - res[k]).abs().max().item() for k in one)
assert dres == 0, f"the resumed run's weights differ from the uninterrupted run's by {dres}"
losses = [json.loads(l)["loss"] for l in open(f"{w}/one.jsonl") if '"loss"' in l and '"type": "validation"' not in l]
assert len(losses) >= 4 and all(math.isfinite(l) for l in losses), losses
ex = weights(f"{w}/ckpt-one/transformer/diffusion_pytorch_model.safetensors")
dex = max(((ex[k] - one[k]).norm() / one[k].norm().clamp_min(1e-12)).item() for k in one)
assert dex < 1e-2, f"the bf16 export is not the final weights (rel {dex})"
print(f"wan: weights moved {moved:.3g}; 1 vs 2 ranks rel L2 {d12:.2g}; resume identical; "
      f"export (bf16) rel {dex:.2g}; losses {[round(l, 3) for l in losses]}")
PY
grep -q "exported step [0-9]* (bf16)" "$work/one.log" || { cat "$work/one.log"; echo "FAIL: no ddptrainsink-export message"; exit 1; }
"$build/tools/videotrain-model" info "$work/ckpt-one/transformer" | grep -q "stored BF16" || {
  echo "FAIL: the export is not a bf16 folder that videotrain-model reads"; exit 1; }
# export takes the run's checkpoint-dir (its newest verified step) and gives the same folder as the
# run's own export (issue 38 item 4).
"$build/tools/videotrain-model" export "$work/ckpt-one" "$work/exported" --dtype bf16 > "$work/export.log" \
  || { cat "$work/export.log"; echo "FAIL: export of the checkpoint-dir"; exit 1; }
grep -q "newest verified checkpoint" "$work/export.log" || { cat "$work/export.log"; echo "FAIL: export did not pick a step"; exit 1; }
cmp "$work/exported/diffusion_pytorch_model.safetensors" "$work/ckpt-one/transformer/diffusion_pytorch_model.safetensors" \
  || { echo "FAIL: export of the checkpoint-dir differs from the run's export"; exit 1; }
echo "wan: export of the checkpoint-dir equals the run's export"
# Fine-tuning from the fine-tune: model= takes the exported folder.
run again 1 4 2 1 false "$work/ckpt-one/transformer" || { cat "$work/again.log"; echo "FAIL: the exported folder does not train"; exit 1; }
echo "wan: the exported folder trains again"
if run bad 1 4 2 1 false "$ref/wan_vae/tiny_wan21"; then
  echo "FAIL: a VAE folder was taken as the model"; exit 1
fi
grep -q "AutoencoderKLWan" "$work/bad.log" || { cat "$work/bad.log"; echo "FAIL: the error does not name the class"; exit 1; }
echo "wan: a VAE folder as model= fails at start naming its class"
# LoRA: rank 4 on the attention projections; 1 vs 2 ranks, resume, a LoRA-sized checkpoint, the
# exported files (diffusers and ComfyUI naming) applied by videotrain-model give the trained outputs.
lora="lora-rank=4 lora-alpha=8 lora-format=all"
run lone 1 4 2 4 false "$work/dit" "$lora" || { cat "$work/lone.log"; echo "FAIL: the 1-rank LoRA run did not end"; exit 1; }
run ltwo 2 2 1 4 false "$work/dit" "$lora" || { cat "$work/ltwo.log"; echo "FAIL: the 2-rank LoRA run did not end"; exit 1; }
run lres 1 4 2 2 false "$work/dit" "$lora" || { cat "$work/lres.log"; echo "FAIL: the LoRA run to 2 did not end"; exit 1; }
run lres 1 4 2 4 true "$work/dit" "$lora" || { cat "$work/lres.log"; echo "FAIL: the resumed LoRA run did not end"; exit 1; }
/usr/bin/python3 - "$work" <<'PY'
import json, os, struct, sys
import torch
w = sys.argv[1]
def read(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n)); data = f.read()
    return ({k: torch.frombuffer(bytearray(data[v["data_offsets"][0]:v["data_offsets"][1]]), dtype=torch.float32).reshape(v["shape"])
             for k, v in h.items() if k != "__metadata__"}, h.get("__metadata__", {}))
ck = lambda r: f"{w}/ckpt-{r}/step-00000004"
one, meta = read(ck("lone") + "/pytorch_lora_weights.safetensors")
two, _ = read(ck("ltwo") + "/pytorch_lora_weights.safetensors")
res, _ = read(ck("lres") + "/pytorch_lora_weights.safetensors")
assert len(one) == 32 and all(k.startswith("transformer.blocks.") and ".lora_" in k for k in one), sorted(one)[:4]
assert any(v.abs().max() > 0 for k, v in one.items() if "lora_B" in k), "lora_B did not train"
flat = lambda ws: torch.cat([ws[k].flatten() for k in sorted(ws)])
d12 = ((flat(one) - flat(two)).norm() / flat(one).norm()).item()
assert d12 < 1e-6, f"LoRA 1 vs 2 ranks: rel L2 {d12}"
assert torch.equal(flat(one), flat(res)), "the resumed LoRA differs from the uninterrupted one"
cfg = json.loads(meta["lora_adapter_metadata"])
assert cfg["transformer.r"] == 4 and cfg["transformer.lora_alpha"] == 8, cfg
files = os.listdir(ck("lone"))
assert not any(f.startswith("diffusion_pytorch_model") for f in files), files
size = sum(os.path.getsize(os.path.join(ck("lone"), f)) for f in files)
base = os.path.getsize(f"{w}/dit/diffusion_pytorch_model.safetensors")
exported = sorted(os.listdir(f"{w}/ckpt-lone/lora"))
assert exported == ["lora_comfyui.safetensors", "lora_kohya.safetensors", "pytorch_lora_weights.safetensors"], exported
print(f"wan lora: 1 vs 2 ranks rel L2 {d12:.2g}; resume identical; checkpoint {size} bytes (weights, optimizer, "
      f"trainer.json) against the base model's {base}; no base tensor; exported {exported}")
PY
# The exported files give the same outputs whichever naming videotrain-model reads.
/usr/bin/python3 - "$work" "$ref" <<'PY'
import json, struct, sys
w, ref = sys.argv[1:]
def write(path, tensors):
    import torch
    header, blobs, off = {}, [], 0
    for k, t in tensors.items():
        b = t.contiguous().numpy().tobytes()
        header[k] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b); off += len(b)
    h = json.dumps(header).encode()
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
import torch
g = torch.Generator().manual_seed(0)
write(f"{w}/in.safetensors", {"hidden_states": torch.randn(1, 4, 2, 4, 4, generator=g), "timestep": torch.tensor([500.0]),
                              "encoder_hidden_states": torch.randn(1, 16, 32, generator=g)})
PY
for f in pytorch_lora_weights lora_comfyui lora_kohya; do
  "$build/tools/videotrain-model" forward "$work/dit" "$work/in.safetensors" "$work/out-$f.safetensors"     --lora "$work/ckpt-lone/lora/$f.safetensors" > /dev/null || { echo "FAIL: forward --lora $f"; exit 1; }
done
"$build/tools/videotrain-model" forward "$work/dit" "$work/in.safetensors" "$work/out-base.safetensors" > /dev/null
/usr/bin/python3 - "$work" <<'PY'
import json, struct, sys
import torch
w = sys.argv[1]
def out(name):
    with open(f"{w}/out-{name}.safetensors", "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n)); data = f.read()
    v = h["output"]; return torch.frombuffer(bytearray(data[v["data_offsets"][0]:v["data_offsets"][1]]), dtype=torch.float32)
d, c, k, b = out("pytorch_lora_weights"), out("lora_comfyui"), out("lora_kohya"), out("base")
assert torch.equal(d, c) and torch.equal(d, k), "the three namings give different outputs"
assert not torch.equal(d, b), "the LoRA changes nothing"
print("wan lora: the diffusers, ComfyUI and kohya files give identical outputs, different from the base")
PY
# A LoRA run's checkpoint-dir exports its LoRA in the naming asked for, and info reads a LoRA file.
"$build/tools/videotrain-model" export "$work/ckpt-lone" "$work/lora-export" --format comfyui > "$work/lexport.log" \
  || { cat "$work/lexport.log"; echo "FAIL: export of a LoRA checkpoint-dir"; exit 1; }
"$build/tools/videotrain-model" info "$work/lora-export/lora_comfyui.safetensors" > "$work/linfo.log" \
  || { cat "$work/linfo.log"; echo "FAIL: info of a LoRA file"; exit 1; }
for want in "naming: comfyui" "rank: 4" "alpha: 8" "attn1.to_q" "fits: a Wan transformer with at least 2 blocks"; do
  grep -q "$want" "$work/linfo.log" || { cat "$work/linfo.log"; echo "FAIL: LoRA info lacks '$want'"; exit 1; }
done
echo "wan lora: the checkpoint-dir exports its LoRA as ComfyUI; info names naming, rank, alpha, targets, model"
if run lbad 1 4 2 1 false "$work/dit" "lora-rank=4 lora-targets=to_q,to_qq"; then echo "FAIL: a target naming nothing trained"; exit 1; fi
grep -q "'to_qq' names no Linear module" "$work/lbad.log" || { cat "$work/lbad.log"; echo "FAIL: the bad target is not named"; exit 1; }
echo "wan lora: a target naming nothing fails at start naming it"
echo "9 passed, 0 failed"
