#!/usr/bin/env python3
"""transformers' CLIPVisionModel / CLIPVisionModelWithProjection and CLIPImageProcessor (Wan 2.1 I2V /
FLF2V's image_encoder/ and image_processor/) against `videotrain-model forward` on the folders
transformers writes: a tiny encoder at Wan's 224 px / patch 14 (257 tokens), seeded random weights with
every parameter jittered, save_pretrained in float32; every hidden state (Wan takes hidden_states[-2]),
pooler_output and image_embeds within 1e-5 relative L2; the same weights in transformers 4's layout
(`vision_model.` prefix, as the published Wan folders hold them). The processor with Wan's own
preprocessor_config.json on non-square uint8 frames (480x832 shrunk, 90x60 grown): pixel_values against
CLIPImageProcessor's, then the encoder on them. A perturbed copy of our output must fail the check."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import interop_util as u  # noqa: E402

torch, transformers, st, np = u.need("torch", "transformers", "safetensors.torch", "numpy")

TOL = 1e-5
tool = u.tool("videotrain-model")
tmp = u.tempdir()
T = tmp.name

# Wan2.1-I2V-14B-480P-Diffusers' image_processor/preprocessor_config.json.
WAN_PROCESSOR = {
    "crop_size": {"height": 224, "width": 224}, "do_center_crop": True, "do_convert_rgb": True, "do_normalize": True,
    "do_rescale": True, "do_resize": True, "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_processor_type": "CLIPImageProcessor", "image_std": [0.26862954, 0.26130258, 0.27577711], "resample": 3,
    "rescale_factor": 0.00392156862745098, "size": {"shortest_edge": 224}}


def model(cls, act, seed):
    torch.manual_seed(seed)
    config = transformers.CLIPVisionConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                           num_attention_heads=4, image_size=224, patch_size=14, projection_dim=24,
                                           hidden_act=act, layer_norm_eps=1e-5)
    m = cls(config).eval().float()
    with torch.no_grad():  # LayerNorm gains start at 1, biases at 0: jitter everything so each one counts
        for p in m.parameters():
            p.add_(0.1 * torch.randn(p.shape) * (p.abs().mean() + 0.1))
    return m


def forward(folder, feed, *extra):
    inp, out = os.path.join(T, "in.safetensors"), os.path.join(T, "out.safetensors")
    st.save_file({k: v.contiguous() for k, v in feed.items()}, inp)
    u.run(tool, "forward", folder, inp, out, *extra)
    return st.load_file(out)


def compare(name, ref, ours):
    worst = 0.0
    for i, h in enumerate(ref.hidden_states):
        worst = max(worst, u.close(h, ours[f"hidden_states.{i}"], TOL, f"{name}: hidden_states[{i}] {tuple(h.shape)}"))
    u.close(ref.last_hidden_state, ours["last_hidden_state"], TOL, f"{name}: last_hidden_state")
    if hasattr(ref, "image_embeds") and ref.image_embeds is not None:
        u.close(ref.image_embeds, ours["image_embeds"], TOL, f"{name}: image_embeds")
    else:
        u.close(ref.pooler_output, ours["pooler_output"], TOL, f"{name}: pooler_output")
    print(f"FIGURE transformers {name}: worst hidden state rel L2 {worst:.3g}")
    pen = ours[f"hidden_states.{len(ref.hidden_states) - 2}"]
    noise = torch.randn(pen.shape, generator=torch.Generator().manual_seed(9)) * pen.norm() / pen.numel() ** 0.5
    u.check(u.rel(ref.hidden_states[-2], pen + 1e-3 * noise) > TOL, f"{name}: a 1e-3 perturbation of ours fails the check")


pixels = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(1))

# CLIPVisionModel (Wan's class, exact GELU), as transformers 5 saves it.
vit = model(transformers.CLIPVisionModel, "gelu", 0)
folder = os.path.join(T, "wan", "image_encoder")
vit.save_pretrained(folder)
with torch.no_grad():
    ref = vit(pixel_values=pixels, output_hidden_states=True)
u.check(ref.hidden_states[-2].shape == (2, 257, 64), "Wan's hidden_states[-2]: 257 tokens at 224 px, patch 14")
compare("CLIPVisionModel", ref, forward(folder, {"pixel_values": pixels}))
info = u.run(tool, "info", folder)
u.check("class: CLIPVisionModel " in info.stdout, "info names CLIPVisionModel")
u.check(f"parameters: {vit.num_parameters()} " in info.stdout,
        f"info's parameter count is transformers' num_parameters() = {vit.num_parameters()}")
u.check("257 tokens" in info.stdout, "info says 257 tokens")

# The same weights in transformers 4's layout (`vision_model.` prefix): transformers and we both load it.
old = os.path.join(T, "v4", "image_encoder")
os.makedirs(old)
tensors = st.load_file(os.path.join(folder, "model.safetensors"))
st.save_file({"vision_model." + k: v for k, v in tensors.items()}, os.path.join(old, "model.safetensors"),
             metadata={"format": "pt"})
with open(os.path.join(folder, "config.json")) as f, open(os.path.join(old, "config.json"), "w") as g:
    g.write(f.read())
reloaded = transformers.CLIPVisionModel.from_pretrained(old).eval()
with torch.no_grad():
    u.check(torch.equal(reloaded(pixel_values=pixels).last_hidden_state, ref.last_hidden_state),
            "transformers loads the prefixed layout to the same weights")
compare("CLIPVisionModel, transformers 4 layout", ref, forward(old, {"pixel_values": pixels}))

# CLIPVisionModelWithProjection with OpenAI's quick_gelu.
proj = model(transformers.CLIPVisionModelWithProjection, "quick_gelu", 1)
pfolder = os.path.join(T, "proj")
proj.save_pretrained(pfolder)
with torch.no_grad():
    compare("CLIPVisionModelWithProjection", proj(pixel_values=pixels, output_hidden_states=True),
            forward(pfolder, {"pixel_values": pixels}))

# The processor: Wan's config beside the encoder (image_processor/, found without --processor).
pdir = os.path.join(T, "wan", "image_processor")
os.makedirs(pdir)
with open(os.path.join(pdir, "preprocessor_config.json"), "w") as f:
    json.dump(WAN_PROCESSOR, f)
processor = transformers.CLIPImageProcessor.from_pretrained(pdir)
print("transformers' processor:", type(processor).__name__)
rng = np.random.default_rng(3)
for name, (h, w) in (("480x832 frame", (480, 832)), ("90x60 grown", (90, 60))):
    y, x = np.mgrid[0:h, 0:w]
    img = np.clip(np.stack([x * 255 / w, y * 255 / h, (x ^ y) % 97 * 2.6], -1) + rng.normal(0, 30, (h, w, 3)), 0, 255)
    img = img.astype(np.uint8)
    want = processor(images=img, return_tensors="pt")["pixel_values"]
    ours = forward(os.path.join(T, "wan", "image_encoder"), {"images": torch.from_numpy(img)[None]})
    d = (ours["pixel_values"] - want).abs()
    level = 1 / 255 / min(WAN_PROCESSOR["image_std"])  # one 8-bit step after normalisation
    print(f"FIGURE CLIPImageProcessor {name}: max |diff| {d.max().item():.3g}, "
          f"{int((d > 1e-6).sum())} of {d.numel()} values differ (one 8-bit step is {level:.3g})")
    u.check(d.max().item() <= level + 1e-6 and (d > 1e-6).float().mean().item() < 1e-2,
            f"{name}: pixel_values within the resize's rounding of CLIPImageProcessor's")
    with torch.no_grad():
        r = vit(pixel_values=want, output_hidden_states=True).hidden_states[-2]
    u.close(r, ours[f"hidden_states.{len(ref.hidden_states) - 2}"], TOL, f"{name}: hidden_states[-2] from the image")

# Wrong input says what to give.
bad, res = os.path.join(T, "bad.safetensors"), os.path.join(T, "o.safetensors")
st.save_file({"input_ids": torch.zeros(1, 4, dtype=torch.int64)}, bad)
p = u.run(tool, "forward", folder, bad, res, check=False)
u.check(p.returncode == 1 and "pixel_values" in p.stderr and "images" in p.stderr,
        "an image encoder given a text encoder's inputs names pixel_values and images")
st.save_file({"pixel_values": pixels[:, :, :200].contiguous()}, bad)
p = u.run(tool, "forward", folder, bad, res, check=False)
u.check(p.returncode == 1 and "224" in p.stderr, "pixel_values of another size are refused, naming 224")
st.save_file({"images": torch.zeros(1, 8, 8, 3, dtype=torch.uint8)}, bad)
p = u.run(tool, "forward", pfolder, bad, res, check=False)
u.check(p.returncode == 1 and "--processor" in p.stderr, "images without an image processor ask for --processor")
u.finish()
