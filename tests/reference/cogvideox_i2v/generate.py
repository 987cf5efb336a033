#!/usr/bin/env python3
"""CogVideoX image-to-video references, computed by diffusers (float64 on CPU, stored float32):
- ../dit/cogvideox_5b_i2v_tiny/ and ../dit/cogvideox15_i2v_tiny/: tiny CogVideoXTransformer3DModel folders in
  the 5b-I2V layout (in_channels 2 x out_channels, use_learned_positional_embeddings: a stored
  patch_embed.pos_embedding) and the 1.5-5B-I2V layout (patch_size_t 2, ofs_embed_dim), with cases.safetensors
  in the format of the other dit/ references (plus input.<c>.ofs for the ofs layout);
- condition.safetensors: CogVideoXImageToVideoPipeline.prepare_latents' image latents on ../cogvideox_vae/tiny_a;
- training_step.safetensors: one native I2V training step of the 1.5-I2V folder (see training_step()).
Read by tests/models/test_cogvideox_transformer.cpp and test_image_condition.cpp. Run from the repository root:
    .venv-torch2/bin/python tests/reference/cogvideox_i2v/generate.py"""
import json
import math
import os
import types

import diffusers
import safetensors.torch as st
import torch
from diffusers import AutoencoderKLCogVideoX, CogVideoXImageToVideoPipeline, CogVideoXTransformer3DModel

HERE = os.path.dirname(os.path.abspath(__file__))
REF = os.path.dirname(HERE)
META = {"diffusers_version": diffusers.__version__, "torch": torch.__version__,
        "generator": "tests/reference/cogvideox_i2v/generate.py"}

COMMON = dict(num_attention_heads=2, attention_head_dim=16, out_channels=4, in_channels=8, time_embed_dim=32,
              text_embed_dim=32, num_layers=2, patch_size=2)
LAYOUTS = {
    # CogVideoX-5b-I2V: rotary and learned positions (the stored table replaces the sincos one at the sample
    # size; at other frame counts diffusers adds the sincos table), 226 text rows, sample 8x12 latents, 9 frames.
    "cogvideox_5b_i2v_tiny": dict(COMMON, use_rotary_positional_embeddings=True, use_learned_positional_embeddings=True,
                                  sample_height=8, sample_width=12, sample_frames=9, max_text_seq_length=226),
    # CogVideoX1.5-5B-I2V: rotary, temporal patches of 2, Linear patch embedding, ofs embedding.
    "cogvideox15_i2v_tiny": dict(COMMON, use_rotary_positional_embeddings=True, patch_size_t=2, patch_bias=False,
                                 ofs_embed_dim=32, sample_height=16, sample_width=16, sample_frames=17,
                                 max_text_seq_length=224),
}
# (case, batch, latent frames, h, w, timesteps, ofs, parameter gradients)
CASES = {
    "cogvideox_5b_i2v_tiny": [("b2_t3_h8_w12", 2, 3, 8, 12, [678, 407], None, True),   # stored table
                              ("b1_t5_h8_w12", 1, 5, 8, 12, [359], None, False)],      # sincos at 5 frames
    "cogvideox15_i2v_tiny": [("b2_t4_h8_w12", 2, 4, 8, 12, [678, 407], [2.0], True),   # the pipeline's ofs
                             ("b1_t6_h4_w6", 1, 6, 4, 6, [359], [0.5], False)],
}


def jitter(model, g):
    """Norm gains 1 + 0.2 N, their biases 0.1 N, the rest diffusers' seeded init; the learned table sincos + 0.5 N."""
    with torch.no_grad():
        for name, m in model.named_modules():
            if isinstance(m, torch.nn.LayerNorm) and m.weight is not None:
                m.weight.copy_(1 + 0.2 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=g))
        for name, b in model.named_buffers():
            if name == "patch_embed.pos_embedding":
                b.add_(0.5 * torch.randn(b.shape, generator=g))


def rotary(model, F, h, w):
    stub = types.SimpleNamespace(vae_scale_factor_spatial=8, transformer=model)
    return CogVideoXImageToVideoPipeline._prepare_rotary_positional_embeddings(stub, 8 * h, 8 * w, F, torch.device("cpu"))


def transformer(name, seed):
    torch.manual_seed(seed)
    model = CogVideoXTransformer3DModel(**LAYOUTS[name]).eval()
    g = torch.Generator().manual_seed(seed)
    jitter(model, g)
    folder = os.path.join(REF, "dit", name)
    model.save_pretrained(folder, safe_serialization=True)
    model = model.double()
    out, cases = {}, {}
    for c, B, F, h, w, ts, ofs, params in CASES[name]:
        C = model.config.in_channels
        L = model.config.max_text_seq_length
        x = torch.randn(B, F, C, h, w, generator=g)
        text = torch.randn(B, L, 32, generator=g)
        t = torch.tensor(ts, dtype=torch.int64)
        cos, sin = rotary(model, F, h, w)
        xl, tl = x.double().requires_grad_(True), text.double().requires_grad_(True)
        model.zero_grad(set_to_none=True)
        kw = {"ofs": torch.tensor(ofs, dtype=torch.float64)} if ofs is not None else {}
        y = model(xl, tl, t, image_rotary_emb=(cos.double(), sin.double()), return_dict=False, **kw)[0]
        cot = torch.randn(y.shape, generator=g)
        (y * cot.double()).sum().backward()
        out.update({f"input.{c}.hidden_states": x, f"input.{c}.timestep": t, f"input.{c}.encoder_hidden_states": text,
                    f"input.{c}.rotary_cos": cos, f"input.{c}.rotary_sin": sin, f"output.{c}": y.detach(),
                    f"cotangent.{c}": cot, f"grad_input.{c}.hidden_states": xl.grad,
                    f"grad_input.{c}.encoder_hidden_states": tl.grad})
        if ofs is not None:
            out[f"input.{c}.ofs"] = torch.tensor(ofs)
        if params:
            for pname, p in model.named_parameters():
                out[f"grad.{c}.{pname}"] = p.grad
        cases[c] = {"hidden_states": list(x.shape), "timestep": ts, "encoder_hidden_states": list(text.shape),
                    "ofs": ofs, "parameter_gradients": params}
    meta = dict(META, model=name, seed=str(seed), dtype="float64, stored as float32", cases=json.dumps(cases),
                call="model(hidden_states, encoder_hidden_states, timestep, image_rotary_emb=(rotary_cos, rotary_sin), "
                     "ofs=<input.<c>.ofs where given>, return_dict=False)[0]")
    st.save_file({k: (v if v.dtype == torch.int64 else v.float()).contiguous() for k, v in out.items()},
                 os.path.join(folder, "cases.safetensors"), metadata=meta)
    print("wrote", folder, len(out), "tensors")


def condition():
    """prepare_latents as __call__ runs it, on ../cogvideox_vae/tiny_a: 1.0 layout (9 frames -> 3 latent frames) and
    1.5 layout (patch_size_t 2: __call__ pads 9 frames to 13, 4 latent frames; the VAE config's
    invert_scale_latents true as CogVideoX1.5's). The posterior is drawn with the pipeline's generator."""
    vae = AutoencoderKLCogVideoX.from_pretrained(os.path.join(REF, "cogvideox_vae", "tiny_a")).eval()
    g = torch.Generator().manual_seed(301)
    frames = torch.rand(1, 3, 9, 32, 48, generator=g) * 2 - 1
    out = {"frames": frames}
    cases = {}
    for c, pt, invert, seed in (("cogvideox", None, False, 11), ("cogvideox15", 2, True, 12)):
        vae.register_to_config(invert_scale_latents=invert)
        stub = types.SimpleNamespace(vae=vae, vae_scale_factor_temporal=4, vae_scale_factor_spatial=8,
                                     vae_scaling_factor_image=vae.config.scaling_factor,
                                     scheduler=types.SimpleNamespace(init_noise_sigma=1.0),
                                     transformer=types.SimpleNamespace(config=types.SimpleNamespace(patch_size_t=pt)))
        num_frames, latent_frames = 9, (9 - 1) // 4 + 1
        if pt is not None and latent_frames % pt:  # as __call__ pads them
            num_frames += (pt - latent_frames % pt) * 4
        with torch.no_grad():
            _, image_latents = CogVideoXImageToVideoPipeline.prepare_latents(
                stub, frames[:, :, 0], 1, 4, num_frames, 32, 48, torch.float32, torch.device("cpu"),
                torch.Generator().manual_seed(seed), None)
            posterior = vae.encode(frames[:, :, :1]).latent_dist  # the first frame alone, as prepare_latents
        eps = torch.randn(posterior.mean.shape, generator=torch.Generator().manual_seed(seed))  # the draw it made
        out[f"moments.{c}"] = torch.cat([posterior.mean, posterior.logvar], 1)
        out[f"noise.{c}"] = eps
        out[f"image_latents.{c}"] = image_latents  # [1, F, 4, 4, 6], frames first
        cases[c] = {"patch_size_t": pt, "invert_scale_latents": invert, "num_frames": num_frames,
                    "scaling_factor": vae.config.scaling_factor, "generator_seed": seed}
    meta = dict(META, vae="../cogvideox_vae/tiny_a", cases=json.dumps(cases))
    st.save_file({k: v.float().contiguous() for k, v in out.items()}, os.path.join(HERE, "condition.safetensors"),
                 metadata=meta)
    print("wrote condition.safetensors", {k: list(v.shape) for k, v in out.items()})


def training_step():
    """One native v-prediction step of ../dit/cogvideox15_i2v_tiny as ddptrainsink draws it and diffusers'
    examples/cogvideo/train_cogvideox_image_to_video_lora.py computes it: latents [m, C, t, h, w] (t = 3, odd)
    turned frames first with the first frame repeated in front (4 frames, patch_size_t 2), each sample's
    timestep (uniform) and noise from a CPU generator seeded by the project's per-sample hash
    (../timesteps/make_timesteps.py), add_noise on the noisy latents only, the image latents (the first frame's,
    zeros after it, padded to 4 frames with the image at frame 0) concatenated on channels, ofs 2.0,
    get_velocity on the noisy latents, loss mean(w (x0_pred - x0)^2) with w = 1 / (1 - a_t); model in float64."""
    import sys
    sys.path.insert(0, os.path.join(REF, "timesteps"))
    from make_timesteps import generator_seed
    from diffusers import CogVideoXDPMScheduler
    seed, epoch, ids = 13, 1, [5, 2000007]
    model = CogVideoXTransformer3DModel.from_pretrained(os.path.join(REF, "dit", "cogvideox15_i2v_tiny")).double()
    # CogVideoX's scheduler_config.json with snr_shift_scale 1.0 (rotary models; no ../scheduler here).
    sched = CogVideoXDPMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                  prediction_type="v_prediction", rescale_betas_zero_snr=True, snr_shift_scale=1.0,
                                  timestep_spacing="trailing")
    g = torch.Generator().manual_seed(303)
    x0 = torch.randn(2, 4, 3, 8, 12, generator=g)  # as the trainer gets it: channels first
    cond = torch.zeros(2, 4, 3, 8, 12)
    cond[:, :, 0] = torch.randn(2, 4, 8, 12, generator=g)  # the image's latents at frame 0
    text = torch.randn(2, 224, 32, generator=g)
    x = x0.permute(0, 2, 1, 3, 4)
    x = torch.cat([x[:, :1], x], 1)  # 1.5: the first frame repeated in front to 4 frames
    image = torch.cat([cond.permute(0, 2, 1, 3, 4), torch.zeros(2, 1, 4, 8, 12)], 1)  # image at frame 0
    ts, noises = [], []
    for i, sid in enumerate(ids):
        gs = torch.Generator().manual_seed(generator_seed(seed, sid, epoch))
        u = torch.rand(1, dtype=torch.float64, generator=gs).item()
        ts.append(min(max(int(math.floor(u * 1000)), 0), 999))
        noises.append(torch.randn(x[i].shape, generator=gs, dtype=torch.float32))
    t = torch.tensor(ts, dtype=torch.int64)
    noise = torch.stack(noises)
    x_t = sched.add_noise(x, noise, t)  # float32, as the trainer mixes them
    cos, sin = rotary(model, x.shape[1], 8, 12)
    v = model(torch.cat([x_t, image], 2).double(), text.double(), t, image_rotary_emb=(cos.double(), sin.double()),
              ofs=torch.tensor([2.0], dtype=torch.float64), return_dict=False)[0]
    a = sched.alphas_cumprod.double()[t].view(2, 1, 1, 1, 1)
    pred = a.sqrt() * x_t.double() - (1 - a).sqrt() * v  # get_velocity(v, x_t, t)
    w = 1 / (1 - a)
    loss = (w * (pred - x.double()) ** 2).reshape(2, -1).mean(1).mean()
    loss.backward()
    out = {"x0": x0, "condition": cond, "text_embeds": text, "sample_ids": torch.tensor(ids, dtype=torch.int64),
           "timesteps": t, "loss": loss.detach().reshape(1)}
    for n, p in model.named_parameters():
        out[f"grad.{n}"] = p.grad
    st.save_file({k: (v if v.dtype == torch.int64 else v.float()).contiguous() for k, v in out.items()},
                 os.path.join(HERE, "training_step.safetensors"),
                 metadata=dict(META, model="../dit/cogvideox15_i2v_tiny", seed=str(seed), epoch=str(epoch)))
    print("wrote training_step.safetensors: loss", loss.item(), "timesteps", ts)


transformer("cogvideox_5b_i2v_tiny", 201)
transformer("cogvideox15_i2v_tiny", 202)
condition()
training_step()
