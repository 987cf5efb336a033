#!/usr/bin/env python3
"""The CLIP image encoder of Wan 2.1 I2V / FLF2V (transformers' CLIPVisionModel with its
CLIPImageProcessor) on tiny seeded folders, for the Debian build's check (test clip-vision,
tests/models/test_clip_vision.cpp); the torch2 suite computes the same live
(tests/interop/transformers_clip_vision.py). Run from the repository root:
    .venv-torch2/bin/python tests/reference/clip_vision/generate.py
Writes image_processor/, vit_tiny/, vit_tiny_proj/ and cases.safetensors beside this file."""
import json
import os

import numpy as np
import safetensors.torch as st
import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))


def image(h, w, seed):
    """A uint8 RGB image [h, w, 3]: smooth gradients plus seeded noise (so that the filter's lobes act)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 / max(w - 1, 1), y * 255 / max(h - 1, 1), (x + y) % 64 * 4], axis=-1)
    return np.clip(base + rng.normal(0, 40, (h, w, 3)), 0, 255).astype(np.uint8)


# Wan's image_processor/preprocessor_config.json with the tiny encoder's 28 px instead of 224.
processor_config = {
    "crop_size": {"height": 28, "width": 28}, "do_center_crop": True, "do_convert_rgb": True, "do_normalize": True,
    "do_rescale": True, "do_resize": True, "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_processor_type": "CLIPImageProcessor", "image_std": [0.26862954, 0.26130258, 0.27577711],
    "resample": 3, "rescale_factor": 0.00392156862745098, "size": {"shortest_edge": 28}}
os.makedirs(os.path.join(HERE, "image_processor"), exist_ok=True)
with open(os.path.join(HERE, "image_processor", "preprocessor_config.json"), "w") as f:
    json.dump(processor_config, f, indent=2)
processor = transformers.CLIPImageProcessorPil.from_pretrained(os.path.join(HERE, "image_processor"))

# "down": a 72x128 frame shrunk to 28x49 (antialiased: the filter widens); "up": 20x12 grown to 46x28.
images = {"down": image(72, 128, 1), "up": image(20, 12, 2)}
out = {}
for name, img in images.items():
    out[f"image.{name}"] = torch.from_numpy(img)
    h, w = transformers.image_transforms.get_resize_output_image_size(
        img, size=28, default_to_square=False, input_data_format="channels_last")
    resized = transformers.image_transforms.resize(img, (h, w), resample=3, input_data_format="channels_last")
    out[f"resized.{name}"] = torch.from_numpy(np.ascontiguousarray(resized))
pixel_values = processor(images=[images["down"], images["up"]], return_tensors="pt")["pixel_values"]
out["pixel_values"] = pixel_values

# vit_tiny: CLIPVisionModel as Wan's (exact GELU), saved by transformers 5 (names without `vision_model.`);
# vit_tiny_proj: CLIPVisionModelWithProjection with OpenAI's quick_gelu (names with `vision_model.`).
for name, cls, act, seed in (("vit_tiny", transformers.CLIPVisionModel, "gelu", 0),
                             ("vit_tiny_proj", transformers.CLIPVisionModelWithProjection, "quick_gelu", 1)):
    torch.manual_seed(seed)
    config = transformers.CLIPVisionConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                           num_attention_heads=4, image_size=28, patch_size=7, projection_dim=16,
                                           hidden_act=act, layer_norm_eps=1e-5)
    model = cls(config).eval().float()
    with torch.no_grad():  # LayerNorm gains start at 1 and biases at 0: jitter everything so each one counts
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape) * (p.abs().mean() + 0.1))
    model.save_pretrained(os.path.join(HERE, name))
    with torch.no_grad():
        o = model(pixel_values=pixel_values, output_hidden_states=True)
    for i, h in enumerate(o.hidden_states):
        out[f"hidden_states.{name}.{i}"] = h
    assert torch.equal(o.hidden_states[-1], o.last_hidden_state)  # the last entry is last_hidden_state
    if name == "vit_tiny_proj":
        out[f"image_embeds.{name}"] = o.image_embeds
    else:
        out[f"pooler_output.{name}"] = o.pooler_output

meta = {"transformers": transformers.__version__, "torch": torch.__version__,
        "images": json.dumps({k: list(v.shape) for k, v in images.items()}),
        "processor": "CLIPImageProcessorPil (PIL " + __import__("PIL").__version__ + ")"}
st.save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(HERE, "cases.safetensors"), metadata=meta)
print("wrote", len(out), "tensors")
