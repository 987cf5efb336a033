#!/usr/bin/env python3
"""What diffusers' pipelines say of each model family, for models/model_family.cpp's table (test
model-family; the interop test diffusers-model-families recomputes it live). Run from the torch2 venv:
    .venv-torch2/bin/python tests/reference/model_families/generate.py tests/reference/model_families/families.json
Read from diffusers (its classes, defaults and the pipelines' own functions run on stubs, no weights):
- class, text_encoder_class: the pipeline's transformer and text_encoder annotations;
- frames, width, height, text_length: __call__'s defaults (CogVideoX: the transformer's sample_frames and
  sample_height/width x the VAE's spatial factor, as __call__ fills them);
- layout: prepare_latents' noise shape (channels or frames after the batch);
- text, cleans_prompts: _get_t5_prompt_embeds on a stub tokenizer and encoder (mask passed or not, rows
  past the tokens zero or kept, the caption cleaned or not);
- temporal_padding: whether __call__ pads latent frames to patch_size_t;
- schedule, default_shift: the pipeline's scheduler class (flow matching or CogVideoX's DDPM) and its
  shift (CogVideoX: the scheduler's snr_shift_scale default; Wan: the 480p flow_shift its example sets);
- image_layouts: WanImageToVideoPipeline.prepare_latents on a stub VAE (the condition's channels, with
  one or two images) and whether __call__ encodes images (for a transformer with image_dim: Wan 2.1's);
  CogVideoX's from CogVideoXImageToVideoPipeline.prepare_latents on a stub VAE (image latents, no mask)."""
import inspect
import json
import re
import sys
import types

import torch
import diffusers
from diffusers import (AutoencoderKLCogVideoX, AutoencoderKLWan, CogVideoXDDIMScheduler, CogVideoXImageToVideoPipeline,
                       CogVideoXPipeline, CogVideoXTransformer3DModel, WanImageToVideoPipeline, WanPipeline)


def last_name(annotation):
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    return re.split(r"[ |]", text.replace("<class '", "").replace("'>", ""))[0].split(".")[-1]


def init_class(pipe, name):
    return last_name(inspect.signature(pipe.__init__).parameters[name].annotation)


class StubTokenizer:
    """Three tokens per caption, padded to max_length; remembers the text it was given."""

    def __init__(self):
        self.seen = []

    def __call__(self, prompt, padding=None, max_length=None, **kw):
        self.seen += list(prompt)
        n = 3
        length = max_length if padding == "max_length" else n
        ids = torch.zeros(len(prompt), length, dtype=torch.long)
        ids[:, :n] = torch.arange(1, n + 1)
        return types.SimpleNamespace(input_ids=ids, attention_mask=(ids > 0).long())

    def batch_decode(self, *a, **kw):
        return []


class StubOutput(tuple):
    last_hidden_state = None


class StubEncoder(torch.nn.Module):
    """Every row ones; remembers whether a mask came."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.masked = None
        self.dtype = torch.float32

    def forward(self, ids, mask=None):
        self.masked = mask is not None
        out = StubOutput((torch.ones(ids.shape[0], ids.shape[1], 4),))
        out.last_hidden_state = out[0]
        return out


def text_facts(pipe):
    stub = types.SimpleNamespace(tokenizer=StubTokenizer(), text_encoder=StubEncoder(), _execution_device="cpu")
    length = inspect.signature(pipe.__call__).parameters["max_sequence_length"].default
    e = pipe._get_t5_prompt_embeds(stub, prompt=["  a  &amp;  b "], max_sequence_length=length,
                                   device=torch.device("cpu"), dtype=torch.float32)
    zero_rows = bool((e[0, 3:] == 0).all())
    if stub.text_encoder.masked and zero_rows:
        text = "zero-padded"
    elif not stub.text_encoder.masked and not zero_rows:
        text = "unmasked"
    else:
        text = "other"
    return {"text": text, "text_length": int(e.shape[1]), "cleans_prompts": stub.tokenizer.seen[0] != "  a  &amp;  b "}


def layout(pipe, frames_arg_first):
    stub = types.SimpleNamespace(vae_scale_factor_temporal=4, vae_scale_factor_spatial=8,
                                 scheduler=types.SimpleNamespace(init_noise_sigma=1.0))
    args = (1, 5, 9, 32, 48) if frames_arg_first else (1, 5, 32, 48, 9)  # batch, channels, ...
    x = pipe.prepare_latents(stub, *args, torch.float32, torch.device("cpu"), None)
    return "channels-first" if x.shape[1] == 5 else "frames-first"


class StubVae(torch.nn.Module):
    def __init__(self, z):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.config = types.SimpleNamespace(z_dim=z, latents_mean=[0.0] * z, latents_std=[1.0] * z)
        self.dtype = torch.float32
        self.z = z

    def encode(self, video):
        b, _, t, h, w = video.shape
        mode = torch.zeros(b, self.z, (t - 1) // 4 + 1, h // 8, w // 8)
        return types.SimpleNamespace(latent_dist=types.SimpleNamespace(mode=lambda: mode))


def wan_image_layouts():
    z = inspect.signature(AutoencoderKLWan.__init__).parameters["z_dim"].default
    temporal = 2 ** sum(inspect.signature(AutoencoderKLWan.__init__).parameters["temperal_downsample"].default)
    call = inspect.getsource(WanImageToVideoPipeline.__call__)
    # __call__ encodes the image(s) only for a transformer with image_dim: the published Wan 2.1 I2V/FLF2V
    # configs set it (1280, CLIP ViT-H), Wan 2.2 I2V A14B's is null (a fact of those configs, not of diffusers).
    guarded = re.search(r"config\.image_dim is not None[^\n]*:\n(?:[^\n]*\n){0,6}?[^\n]*encode_image", call)
    out = []
    for name, two, boundary in (("Wan 2.1 I2V", False, None), ("Wan 2.1 FLF2V", True, None),
                                ("Wan 2.2 I2V", False, 0.9)):
        def condition_channels(channels):  # prepare_latents' condition for a VAE of `channels` latents
            stub = types.SimpleNamespace(vae_scale_factor_temporal=temporal, vae_scale_factor_spatial=8,
                                         vae=StubVae(channels),
                                         config=types.SimpleNamespace(expand_timesteps=False, boundary_ratio=boundary))
            image = torch.zeros(1, 3, 32, 48)
            _, cond = WanImageToVideoPipeline.prepare_latents(stub, image, 1, channels, 32, 48, 9, torch.float32,
                                                              torch.device("cpu"), None, None, image if two else None)
            return cond.shape[1]
        mask = condition_channels(z) - z
        out.append({"name": name, "mask_channels": mask, "condition_latents": condition_channels(8) == mask + 8,
                    "in_channels_z16": 16 + condition_channels(16), "image_embeddings": bool(guarded) and boundary is None,
                    "images": 2 if two else 1})
    return out


def cog_image_layouts():
    """CogVideoXImageToVideoPipeline.prepare_latents on a stub VAE: the image latents (frames-first) it puts after
    the noisy ones, their channels for a VAE of 8 and of 16 latents; no mask; no image encoder in the pipeline."""
    def condition_channels(channels):
        vae = StubVae(channels)
        vae.config = types.SimpleNamespace(invert_scale_latents=False)
        vae.encode = lambda v: types.SimpleNamespace(latent_dist=types.SimpleNamespace(
            sample=lambda generator=None: torch.zeros(v.shape[0], channels, 1, v.shape[3] // 8, v.shape[4] // 8)))
        stub = types.SimpleNamespace(vae_scale_factor_temporal=4, vae_scale_factor_spatial=8, vae=vae,
                                     vae_scaling_factor_image=0.7, scheduler=types.SimpleNamespace(init_noise_sigma=1.0),
                                     transformer=types.SimpleNamespace(config=types.SimpleNamespace(patch_size_t=None)))
        _, image_latents = CogVideoXImageToVideoPipeline.prepare_latents(
            stub, torch.zeros(1, 3, 32, 48), 1, channels, 9, 32, 48, torch.float32, torch.device("cpu"), None, None)
        return image_latents.shape[2]
    mask = condition_channels(16) - 16
    encoder = "image_encoder" in inspect.signature(CogVideoXImageToVideoPipeline.__init__).parameters
    return [{"name": "CogVideoX I2V", "mask_channels": mask, "condition_latents": condition_channels(8) == mask + 8,
             "in_channels_z16": 16 + condition_channels(16), "image_embeddings": encoder, "images": 1}]


def facts():
    wan_doc = inspect.getsource(diffusers.pipelines.wan.pipeline_wan)
    wan_call = inspect.signature(WanPipeline.__call__).parameters
    wan = {"class": init_class(WanPipeline, "transformer"), "text_encoder_class": init_class(WanPipeline, "text_encoder"),
           "frames": wan_call["num_frames"].default, "width": wan_call["width"].default,
           "height": wan_call["height"].default, "layout": layout(WanPipeline, False),
           "temporal_padding": "patch_size_t" in inspect.getsource(WanPipeline.__call__),
           "schedule": "flow" if init_class(WanPipeline, "scheduler").startswith("FlowMatch") else "ddpm",
           "default_shift": float(re.search(r"([0-9.]+) for 480P", wan_doc).group(1)),
           "image_layouts": wan_image_layouts()}
    wan.update(text_facts(WanPipeline))
    t = inspect.signature(CogVideoXTransformer3DModel.__init__).parameters
    spatial = 2 ** (len(inspect.signature(AutoencoderKLCogVideoX.__init__).parameters["block_out_channels"].default) - 1)
    cog = {"class": init_class(CogVideoXPipeline, "transformer"),
           "text_encoder_class": init_class(CogVideoXPipeline, "text_encoder"),
           "frames": t["sample_frames"].default, "width": t["sample_width"].default * spatial,
           "height": t["sample_height"].default * spatial, "layout": layout(CogVideoXPipeline, True),
           "temporal_padding": "patch_size_t" in inspect.getsource(CogVideoXPipeline.__call__),
           "schedule": "flow" if init_class(CogVideoXPipeline, "scheduler").startswith("FlowMatch") else "ddpm",
           "default_shift": CogVideoXDDIMScheduler().config.snr_shift_scale, "image_layouts": cog_image_layouts()}
    cog.update(text_facts(CogVideoXPipeline))
    return {"diffusers": diffusers.__version__, "families": {"wan": wan, "cogvideox": cog}}


def without_version(f):
    return {k: v for k, v in f.items() if k != "diffusers"}


if __name__ == "__main__":
    f = facts()
    with open(sys.argv[1], "w") as out:
        json.dump(f, out, indent=1, sort_keys=True)
        out.write("\n")
    print(json.dumps(f, indent=1, sort_keys=True))
