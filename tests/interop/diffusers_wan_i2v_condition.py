#!/usr/bin/env python3
"""Image-to-video conditioning against diffusers live: tests/reference/wan_i2v_condition/generate.py
runs now, with this diffusers, WanImageToVideoPipeline.prepare_latents on the tiny Wan 2.1 VAE (first
frame; first and last frame) and a Wan 2.2 I2V-style training step (diffusers' WanTransformer3DModel on
cat([x_t, mask, condition latents]), the loss on the noisy channels). The stored files must equal
its output, and test-image-condition (argv[1]) must match the live files as it matches the stored ones
(VIDEOTRAIN_I2V_CONDITION_REFERENCE names the live folder)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import interop_util as u  # noqa: E402

torch, st, diffusers = u.need("torch", "safetensors.torch", "diffusers")
sys.path.insert(0, os.path.join(u.source_dir(), "tests", "reference", "wan_i2v_condition"))
import generate  # noqa: E402

binary = sys.argv[1]
tmp = u.tempdir()
generate.write(tmp.name)
for name in ("condition.safetensors", "training_step.safetensors"):
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
u.check("[  PASSED  ] 6 tests" in p.stdout, "it ran all 6 cases")
u.finish()
