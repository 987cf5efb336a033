#!/usr/bin/env python3
"""Writes the image-to-video conditioning references beside this file (or into argv[1]) with
diffusers (the torch2 venv: .venv-torch2/bin/python tests/reference/wan_i2v_condition/generate.py):

- condition.safetensors: WanImageToVideoPipeline.prepare_latents on the tiny Wan 2.1 VAE
  (../wan_vae/tiny_wan21) for seeded clips in [-1, 1]: `frames.<case>` [1, 3, T, H, W] and its
  `first-frame.<case>` (image = frame 0) and `first-last-frame.<case>` (last_image = frame T-1)
  condition, [1, 4 + z, t, h, w] = cat([mask, normalised mode latents]).
- transformer/: a tiny Wan 2.2 I2V-style WanTransformer3DModel (../dit/wan_t2v_tiny's widths with
  in_channels 12 = 4 noisy + 4 mask + 4 condition, no image_dim), seeded init, save_pretrained.
- training_step.safetensors: one native flow-matching step on it as ddptrainsink draws it (each
  sample's sigma and noise from a CPU generator seeded by the project's per-sample hash, ported in
  ../timesteps/make_timesteps.py; Wan's default logit-normal timesteps, flow shift 3), the model run by
  diffusers in float64 on cat([x_t, condition]) and the loss mse(pred, noise - x0) on the 4 noisy
  channels: `x0`, `condition`, `text_embeds`, `text_mask`, `sample_ids`, `loss`, `grad.<parameter>`;
  metadata seed and epoch.
- training_i2v.safetensors, training_flf2v.safetensors, training_ti2v.safetensors: the same step (same
  draws) for Wan 2.1 I2V (../dit/wan21_i2v_tiny: the condition and `image_embeds` [2, 1, 5, 24], the
  image encoder's states, through encoder_hidden_states_image [2, 5, 24]), FLF2V (transformer_flf2v/:
  wan21_i2v_tiny's config with pos_embed_seq_len 10, seeded init with a random pos_embed; image_embeds
  [2, 2, 5, 24], each sample's first then last image, passed as [4, 5, 24] as the pipeline repeats
  them over the batch) and Wan 2.2 TI2V 5B (../dit/wan22_ti2v_tiny with expand_timesteps, as
  WanImageToVideoPipeline runs it: the model's input (1 - first_frame_mask) * condition +
  first_frame_mask * x_t with condition = the clean first latent frame (x0[:, :, :1]: the causal VAE
  encodes the first frame alone into it), timestep (first_frame_mask[0][0][:, ::2, ::2] * t).flatten()
  per sample, the loss on latent frames 1..; `condition` there is what vaeencoder condition=first-frame
  gives, whose mask says "first frame given"). Text 512 rows for the image path (diffusers' processor
  takes the rows before the last 512 as the image's).
"""
import json
import math
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "timesteps"))
from make_timesteps import generator_seed  # noqa: E402  (the project's per-sample seed, ported)

HERE = os.path.dirname(os.path.abspath(__file__))
VAE = os.path.join(HERE, "..", "wan_vae", "tiny_wan21")
T2V = os.path.join(HERE, "..", "dit", "wan_t2v_tiny", "config.json")
CASES = {"T9": (9, 32, 48), "T5": (5, 16, 32)}
SEED, EPOCH, IDS = 11, 2, [3, 1000003]


@torch.no_grad()
def condition_cases():
    from diffusers import AutoencoderKLWan, WanImageToVideoPipeline
    vae = AutoencoderKLWan.from_pretrained(VAE)
    pipe = WanImageToVideoPipeline(tokenizer=None, text_encoder=None, vae=vae, scheduler=None)
    g = torch.Generator().manual_seed(7)
    out = {}
    for name, (T, H, W) in CASES.items():
        frames = torch.rand(1, 3, T, H, W, generator=g) * 2 - 1
        out[f"frames.{name}"] = frames
        first, last = frames[:, :, 0], frames[:, :, T - 1]
        for key, last_image in (("first-frame", None), ("first-last-frame", last)):
            _, cond = pipe.prepare_latents(first, 1, vae.config.z_dim, H, W, T, torch.float32, "cpu",
                                           generator=torch.Generator().manual_seed(0), last_image=last_image)
            out[f"{key}.{name}"] = cond.contiguous()
    return out


def training_case(transformer_dir):
    from diffusers import WanTransformer3DModel
    with open(T2V) as f:
        config = json.load(f)
    config["in_channels"] = 12
    torch.manual_seed(3)
    model = WanTransformer3DModel.from_config(config)
    model.save_pretrained(transformer_dir, safe_serialization=True)
    model = model.double()
    g = torch.Generator().manual_seed(9)
    x0 = torch.randn(2, 4, 3, 8, 12, generator=g)
    cond = torch.randn(2, 8, 3, 8, 12, generator=g)
    cond[:, :4] = (torch.rand(2, 4, 3, 8, 12, generator=g) < 0.3).float()  # a mask's 0/1 values
    text = torch.randn(2, 16, 32, generator=g)
    mask = torch.zeros(2, 16, dtype=torch.int64)
    mask[0, :10] = 1
    mask[1, :5] = 1
    text = text * mask.unsqueeze(-1)
    sigmas, noises = [], []
    for i, sid in enumerate(IDS):
        gs = torch.Generator().manual_seed(generator_seed(SEED, sid, EPOCH))
        u = 1 / (1 + math.exp(-torch.randn(1, dtype=torch.float64, generator=gs).item()))
        sigmas.append(3.0 * u / (1 + 2.0 * u))
        noises.append(torch.randn(x0[i].shape, generator=gs, dtype=torch.float32))
    sigma = torch.tensor(sigmas, dtype=torch.float64).float()
    noise = torch.stack(noises)
    s = sigma.view(2, 1, 1, 1, 1)
    x_t = (1 - s) * x0 + s * noise  # float32, as the trainer mixes them
    pred = model(torch.cat([x_t, cond], 1).double(), (sigma * 1000.0).double(), text.double(),
                 return_dict=False)[0]
    loss = (pred - (noise - x0).double()).pow(2).mean()
    loss.backward()
    out = {"x0": x0, "condition": cond, "text_embeds": text, "text_mask": mask,
           "sample_ids": torch.tensor(IDS, dtype=torch.int64), "loss": loss.detach().float().reshape(1)}
    for n, p in model.named_parameters():
        out[f"grad.{n}"] = p.grad.float().contiguous()
    return out


def flow_draws(x0):
    """Each sample's sigma and noise as ddptrainsink draws them (per-sample seeded generator)."""
    sigmas, noises = [], []
    for i, sid in enumerate(IDS):
        gs = torch.Generator().manual_seed(generator_seed(SEED, sid, EPOCH))
        u = 1 / (1 + math.exp(-torch.randn(1, dtype=torch.float64, generator=gs).item()))
        sigmas.append(3.0 * u / (1 + 2.0 * u))
        noises.append(torch.randn(x0[i].shape, generator=gs, dtype=torch.float32))
    return torch.tensor(sigmas, dtype=torch.float64).float(), torch.stack(noises)


def image_training_case(model, images, ti2v, seed):
    """One step of an image-to-video layout: Wan 2.1 I2V (images 1), FLF2V (2) or TI2V (ti2v)."""
    model = model.double()
    g = torch.Generator().manual_seed(seed)
    C = model.config.out_channels
    x0 = torch.randn(2, C, 3, 8, 12, generator=g)
    cond = torch.randn(2, 4 + C, 3, 8, 12, generator=g)
    cond[:, :4] = 0
    cond[:, :4, 0] = 1  # first-frame's mask: latent frame 0 given
    rows = 16 if ti2v else 512
    text = torch.randn(2, rows, 32, generator=g)
    mask = torch.zeros(2, rows, dtype=torch.int64)
    mask[0, :10] = 1
    mask[1, :5] = 1
    text = text * mask.unsqueeze(-1)
    out = {"x0": x0, "condition": cond, "text_embeds": text, "text_mask": mask,
           "sample_ids": torch.tensor(IDS, dtype=torch.int64)}
    sigma, noise = flow_draws(x0)
    s = sigma.view(2, 1, 1, 1, 1)
    x_t = (1 - s) * x0 + s * noise
    target = (noise - x0).double()
    t = sigma * 1000.0
    if ti2v:
        first_frame_mask = torch.ones(1, 1, 3, 8, 12)
        first_frame_mask[:, :, 0] = 0
        inp = (1 - first_frame_mask) * x0[:, :, :1] + first_frame_mask * x_t
        ts = torch.stack([(first_frame_mask[0][0][:, ::2, ::2] * ti).flatten() for ti in t])
        pred = model(inp.double(), ts.double(), text.double(), return_dict=False)[0]
        loss = (pred[:, :, 1:] - target[:, :, 1:]).pow(2).mean()
    else:
        emb = torch.randn(2, images, 5, model.config.image_dim, generator=g)
        out["image_embeds"] = emb
        pred = model(torch.cat([x_t, cond], 1).double(), t.double(), text.double(),
                     encoder_hidden_states_image=emb.reshape(-1, 5, emb.shape[-1]).double(), return_dict=False)[0]
        loss = (pred - target).pow(2).mean()
    loss.backward()
    out["loss"] = loss.detach().float().reshape(1)
    for n, p in model.named_parameters():
        out[f"grad.{n}"] = p.grad.float().contiguous()
    return out


def image_training_cases(out_dir):
    from diffusers import WanTransformer3DModel
    dit = os.path.join(HERE, "..", "dit")
    i2v = WanTransformer3DModel.from_pretrained(os.path.join(dit, "wan21_i2v_tiny"))
    with open(os.path.join(dit, "wan21_i2v_tiny", "config.json")) as f:
        config = json.load(f)
    config["pos_embed_seq_len"] = 10  # two images of 5 tokens
    torch.manual_seed(5)
    flf2v = WanTransformer3DModel.from_config(config)
    with torch.no_grad():  # zeros at init: random, so that it counts
        flf2v.condition_embedder.image_embedder.pos_embed.normal_(0, 0.5)
    flf2v.save_pretrained(os.path.join(out_dir, "transformer_flf2v"), safe_serialization=True)
    ti2v = WanTransformer3DModel.from_pretrained(os.path.join(dit, "wan22_ti2v_tiny"))
    meta = {"seed": str(SEED), "epoch": str(EPOCH)}
    for name, model, images, is_ti2v in (("i2v", i2v, 1, False), ("flf2v", flf2v, 2, False), ("ti2v", ti2v, 0, True)):
        case = image_training_case(model, images, is_ti2v, seed=30 + len(name))
        save_file(case, os.path.join(out_dir, f"training_{name}.safetensors"), metadata=meta)


def write(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    save_file(condition_cases(), os.path.join(out_dir, "condition.safetensors"))
    case = training_case(os.path.join(out_dir, "transformer"))
    save_file(case, os.path.join(out_dir, "training_step.safetensors"), metadata={"seed": str(SEED), "epoch": str(EPOCH)})
    image_training_cases(out_dir)


if __name__ == "__main__":
    write(sys.argv[1] if len(sys.argv) > 1 else HERE)
