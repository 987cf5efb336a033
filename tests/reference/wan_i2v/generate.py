#!/usr/bin/env python3
"""Wan 2.1 I2V's image path as diffusers' WanTransformer3DModel computes it with the text the Wan
pipelines pass (512 rows, zero past the caption): diffusers' attention processor takes the context's
last 512 rows as text and the rows before them as the image's, so only at 512 rows do
`attn2.add_k_proj`, `add_v_proj` and `norm_added_k` act (../dit/wan21_i2v_tiny's cases have 7 rows:
their image attention is empty). For the Debian build's check (test wan-transformer,
MatchesDiffusersWan21I2VImagePath); the torch2 suite computes the same live
(tests/interop/diffusers_wan_i2v.py). Run from the repository root:
    .venv-torch2/bin/python tests/reference/wan_i2v/generate.py"""
import json
import os

import diffusers
import safetensors.torch as st
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
# Computed in float64 (stored as float32): attn2.to_k.bias's gradient nearly cancels over the 512 keys
# (softmax ignores a shift common to all scores), so a float32 reference would carry its rounding.
model = diffusers.WanTransformer3DModel.from_pretrained(os.path.join(HERE, "..", "dit", "wan21_i2v_tiny")).eval().double()
g = torch.Generator().manual_seed(7)
x = torch.randn(2, 12, 3, 8, 12, generator=g)
text = torch.zeros(2, 512, 32)
text[0, :150] = torch.randn(150, 32, generator=g)  # captions of 150 and 300 tokens, zero-padded to 512
text[1, :300] = torch.randn(300, 32, generator=g)
image = torch.randn(2, 5, 24, generator=g)
timestep = torch.tensor([700.0, 90.0])
leaves = [t.double().requires_grad_(True) for t in (x, text, image)]
y = model(leaves[0], timestep.double(), leaves[1], encoder_hidden_states_image=leaves[2], return_dict=False)[0]
cot = torch.randn(y.shape, generator=g)
(y * cot.double()).sum().backward()
c = "b2_text512"
out = {f"input.{c}.hidden_states": x, f"input.{c}.timestep": timestep, f"input.{c}.encoder_hidden_states": text,
       f"input.{c}.encoder_hidden_states_image": image, f"output.{c}": y.detach(), f"cotangent.{c}": cot,
       f"grad_input.{c}.hidden_states": leaves[0].grad, f"grad_input.{c}.encoder_hidden_states": leaves[1].grad,
       f"grad_input.{c}.encoder_hidden_states_image": leaves[2].grad}
for name, p in model.named_parameters():
    out[f"grad.{c}.{name}"] = p.grad
meta = {"model": "../dit/wan21_i2v_tiny", "dtype": "float64, stored as float32", "diffusers_version": diffusers.__version__, "torch": torch.__version__,
        "cases": json.dumps({c: {"hidden_states": list(x.shape), "encoder_hidden_states": list(text.shape),
                                 "encoder_hidden_states_image": list(image.shape), "parameter_gradients": True}})}
st.save_file({k: v.float().contiguous() for k, v in out.items()}, os.path.join(HERE, "text512_cases.safetensors"), metadata=meta)
print("wrote", len(out), "tensors")
