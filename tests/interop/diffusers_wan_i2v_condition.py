#!/usr/bin/env python3
"""Image-to-video conditioning against diffusers live: tests/reference/wan_i2v_condition/generate.py
runs now, with this diffusers, WanImageToVideoPipeline.prepare_latents on the tiny Wan 2.1 VAE (first
frame; first and last frame) and a Wan 2.2 I2V-style training step (diffusers' WanTransformer3DModel on
cat([x_t, mask, condition latents]), the loss on the noisy channels). The stored files must equal
its output, and test-image-condition (argv[1]) must match the live files as it matches the stored ones
(VIDEOTRAIN_I2V_CONDITION_REFERENCE names the live folder). Likewise the Wan 2.1 I2V, FLF2V and Wan 2.2
TI2V training steps (training_{i2v,flf2v,ti2v}.safetensors) through test-wan-i2v-training (argv[2]),
whose I2V run's export diffusers' WanTransformer3DModel.from_pretrained loads and runs to our forward, and
whose LoRA on the image path (add_k_proj, add_v_proj) diffusers' load_lora_adapter applies as ours does."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import interop_util as u  # noqa: E402

torch, st, diffusers = u.need("torch", "safetensors.torch", "diffusers")
sys.path.insert(0, os.path.join(u.source_dir(), "tests", "reference", "wan_i2v_condition"))
import generate  # noqa: E402

binary, training_binary = sys.argv[1], sys.argv[2]
tmp = u.tempdir()
generate.write(tmp.name)
for name in ("condition.safetensors", "training_step.safetensors", "training_i2v.safetensors",
             "training_flf2v.safetensors", "training_ti2v.safetensors"):
    stored = st.load_file(u.reference_dir("wan_i2v_condition", name))
    live = st.load_file(os.path.join(tmp.name, name))
    u.check(sorted(stored) == sorted(live), f"{name}: the stored file holds the live one's tensors")
    worst = max((u.rel(live[k], stored[k]) for k in live if k in stored and live[k].is_floating_point()), default=1.0)
    u.check(worst <= 1e-6, f"{name}: stored within 1e-6 of diffusers {diffusers.__version__}'s (worst {worst:.3g})")
# The live conditions are diffusers' own: the mask as its prepare_latents lays it out.
live = st.load_file(os.path.join(tmp.name, "condition.safetensors"))
mask = live["first-last-frame.T9"][0, :4, :, 0, 0]
u.check(mask.tolist() == [[1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 1]], f"FLF2V mask over 9 frames {mask.tolist()}")

os.environ["VIDEOTRAIN_I2V_CONDITION_REFERENCE"] = tmp.name
p = u.run(binary, check=False)
u.check(p.returncode == 0, "test-image-condition matches the live prepare_latents and training step")
cases = sum(1 for l in u.run(binary, "--gtest_list_tests").stdout.splitlines() if l.startswith("  "))
u.check(f"[  PASSED  ] {cases} tests" in p.stdout, f"it ran all {cases} cases")

export = os.path.join(tmp.name, "export")
os.makedirs(export)
os.environ["VIDEOTRAIN_I2V_EXPORT_OUT"] = export
p = u.run(training_binary, check=False)
u.check(p.returncode == 0, "test-wan-i2v-training matches the live I2V, FLF2V and TI2V training steps")
u.check("[  PASSED  ] 4 tests" in p.stdout, "it ran all 4 cases")
model, info = diffusers.WanTransformer3DModel.from_pretrained(os.path.join(export, "transformer"),
                                                              output_loading_info=True)
bad = {k: v for k, v in info.items() if v}
u.check(not bad, f"the I2V run's export loads in diffusers with nothing missing or unexpected {bad or ''}")
f = st.load_file(os.path.join(export, "forward.safetensors"))
with torch.no_grad():
    y = model(f["hidden_states"], f["timestep"], f["encoder_hidden_states"],
              encoder_hidden_states_image=f["encoder_hidden_states_image"], return_dict=False)[0]
u.close(y, f["output"], 1e-5, "the exported trained I2V transformer: diffusers' forward vs ours")
# The I2V LoRA (add_k_proj, add_v_proj, to_q) through diffusers' load_lora_adapter vs `forward --lora`.
base = u.reference_dir("dit", "wan21_i2v_tiny")
inp, out = os.path.join(export, "lora_in.safetensors"), os.path.join(export, "lora_out.safetensors")
st.save_file({k: f[k] for k in ("hidden_states", "timestep", "encoder_hidden_states", "encoder_hidden_states_image")}, inp)
u.run(u.tool("videotrain-model"), "forward", base, inp, out, "--lora", os.path.join(export, "lora_i2v.safetensors"))
model = diffusers.WanTransformer3DModel.from_pretrained(base)
with torch.no_grad():
    y0 = model(f["hidden_states"], f["timestep"], f["encoder_hidden_states"],
               encoder_hidden_states_image=f["encoder_hidden_states_image"], return_dict=False)[0]
model.load_lora_adapter(export, weight_name="lora_i2v.safetensors", prefix="transformer")
with torch.no_grad():
    y = model(f["hidden_states"], f["timestep"], f["encoder_hidden_states"],
              encoder_hidden_states_image=f["encoder_hidden_states_image"], return_dict=False)[0]
u.check(u.rel(y, y0) > 1e-3, f"the LoRA changes diffusers' output ({u.rel(y, y0):.3g})")
u.close(y, st.load_file(out)["output"], 1e-5, "the I2V LoRA on the image path: diffusers' load_lora_adapter vs ours")
u.finish()
