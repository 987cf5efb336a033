#!/usr/bin/env python3
"""Image-to-video sampling (ddpsampler with an I2V trainer) against diffusers' own
WanImageToVideoPipeline (output_type="latent") on tiny folders, the same prompt embeddings, image and
seeded noise: `videotrain-model sample --vae [--image-encoder]` builds the condition and image
embeddings as ddpsampler does (models/i2v_inputs) and runs its loop. Cases: the Wan 2.2 I2V layout
(in_channels 12 = 4 noisy + 4 mask + 4 condition latents of the tiny Wan 2.1 VAE, no image embeddings),
the same with a last image (first-last-frame condition), the Wan 2.1 I2V layout with the tiny CLIP
image encoder (image_dim 32, added_kv_proj_dim; text padded to 512 rows, which diffusers' attention needs to
see the image's rows), Wan 2.1 FLF2V (two images, pos_embed_seq_len), and Wan 2.2 TI2V 5B's expand_timesteps (the image's
latents as the clean first frame, its tokens at timestep 0). Each step's latents within 1e-5 relative L2; the
sampler given another image must fail the comparison. CogVideoX I2V against CogVideoXImageToVideoPipeline on
the tiny CogVideoX-5b-I2V (learned positions, 226 text rows) and CogVideoX1.5-5B-I2V (patch_size_t 2, ofs)
folders and the tiny CogVideoX VAE: the image's posterior drawn from the pipeline's generator before the
noise, its latents on channels at every step, the DPM scheduler (the family's default)."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import interop_util as u  # noqa: E402

torch, diffusers, st, transformers, Image = u.need("torch", "diffusers", "safetensors.torch", "transformers", "PIL.Image")
torch.set_num_threads(1)

tool = u.tool("videotrain-model")
TOL = 1e-5
STEPS, G, SEED = 4, 5.0, 7
HEIGHT, WIDTH, FRAMES = 64, 96, 9  # latents [1, 4, 3, 8, 12] through the tiny VAE (factors 8 and 4)

tmp = u.tempdir()
vae_dir = u.reference_dir("wan_vae", "tiny_wan21")
clip_dir = u.reference_dir("clip_vision", "vit_tiny")  # its image_processor/ is the sibling folder
BASE = {"added_kv_proj_dim": None, "attention_head_dim": 16, "cross_attn_norm": True, "eps": 1e-06, "ffn_dim": 64,
        "freq_dim": 32, "image_dim": None, "in_channels": 12, "num_attention_heads": 2, "num_layers": 1,
        "out_channels": 4, "patch_size": [1, 2, 2], "pos_embed_seq_len": None, "qk_norm": "rms_norm_across_heads",
        "rope_max_seq_len": 32, "text_dim": 32}


def transformer(name, **over):
    torch.manual_seed(11)
    m = diffusers.WanTransformer3DModel(**{**BASE, **over}).eval()
    with torch.no_grad():  # diffusers zero-initialises some projections: random weights everywhere
        for p in m.parameters():
            p.copy_(0.2 * torch.randn(p.shape))
    d = os.path.join(tmp.name, name)
    m.save_pretrained(d)
    return m, d


g = torch.Generator().manual_seed(5)
prompt = torch.zeros(1, 16, 32)
prompt[:, :10] = torch.randn(1, 10, 32, generator=g)
negative = torch.zeros(1, 16, 32)
negative[:, :1] = torch.randn(1, 1, 32, generator=g)
first = torch.randint(0, 256, (HEIGHT, WIDTH, 3), generator=g, dtype=torch.uint8)
last = torch.randint(0, 256, (HEIGHT, WIDTH, 3), generator=g, dtype=torch.uint8)
other = torch.randint(0, 256, (HEIGHT, WIDTH, 3), generator=g, dtype=torch.uint8)


def pil(t):
    return Image.fromarray(t.numpy())


def unipc():
    # Wan-AI/Wan2.1-I2V-14B-480P-Diffusers scheduler/scheduler_config.json, at flow_shift 3.
    return diffusers.UniPCMultistepScheduler(
        num_train_timesteps=1000, beta_start=0.0001, beta_end=0.02, beta_schedule="linear", solver_order=2,
        prediction_type="flow_prediction", thresholding=False, predict_x0=True, solver_type="bh2",
        lower_order_final=True, disable_corrector=[], use_flow_sigmas=True, flow_shift=3.0,
        final_sigmas_type="zero", timestep_spacing="linspace", steps_offset=0)


def padded(t, rows=512):
    """The text padded with zero rows to `rows`, as the Wan pipelines pad it to 512."""
    return torch.cat([t, torch.zeros(1, rows - t.shape[1], t.shape[2])], 1)


def compare(name, model, model_dir, images, encoder=False, expand=False, latent="4x3x8x12", vae_at=vae_dir,
            other_image=False):
    # Wan 2.1 I2V / FLF2V: diffusers' attention takes the context's last 512 rows as text, the rows before
    # as the image's, so their text is padded to 512 (with 16 rows the image attention would be empty).
    prompt_embeds, negative_embeds = (padded(prompt), padded(negative)) if encoder else (prompt, negative)
    kw = {}
    if encoder:
        kw["image_encoder"] = transformers.CLIPVisionModel.from_pretrained(clip_dir).eval()
        kw["image_processor"] = transformers.CLIPImageProcessor.from_pretrained(
            os.path.join(os.path.dirname(clip_dir), "image_processor"))
    pipe = diffusers.WanImageToVideoPipeline(tokenizer=None, text_encoder=None,
                                             vae=diffusers.AutoencoderKLWan.from_pretrained(vae_at).eval(),
                                             scheduler=unipc(), transformer=model, expand_timesteps=expand, **kw)
    steps = []

    def keep(p, i, t, cb):
        steps.append(cb["latents"].clone())
        return cb

    with torch.no_grad():
        ref = pipe(image=pil(images[0]), last_image=pil(images[1]) if len(images) > 1 else None,
                   prompt_embeds=prompt_embeds, negative_prompt_embeds=negative_embeds, height=HEIGHT, width=WIDTH,
                   num_frames=FRAMES, num_inference_steps=STEPS, guidance_scale=G,
                   generator=torch.Generator("cpu").manual_seed(SEED), output_type="latent",
                   callback_on_step_end=keep).frames

    def ours(imgs, tag):
        slug = os.path.join(tmp.name, f"{os.path.basename(model_dir)}-{len(images)}-{tag}")
        inp = slug + "-in.safetensors"
        t = {"prompt_embeds": prompt_embeds, "negative_prompt_embeds": negative_embeds, "image": imgs[0].contiguous()}
        if len(imgs) > 1:
            t["last_image"] = imgs[1].contiguous()
        st.save_file(t, inp)
        out = slug + ".safetensors"
        args = ["sample", model_dir, inp, out, "--latent", latent, "--sampler", "unipc", "--steps", STEPS,
                "--shift", 3.0, "--guidance", G, "--seed", SEED, "--vae", vae_at]
        if expand:
            args.append("--expand-timesteps")
        if encoder:
            args += ["--image-encoder", clip_dir]
        u.run(tool, *args)
        return st.load_file(out)

    got = ours(images, "same")
    rs = [u.rel(steps[k], got["latents_after_step"][k]) for k in range(STEPS)]
    u.check(max(rs) <= TOL, f"{name}: each of the {STEPS} steps within {TOL:g} of WanImageToVideoPipeline's "
                            f"(worst {max(rs):.3g})")
    r = u.close(ref, got["latents"], TOL, f"{name}: final latents vs WanImageToVideoPipeline")
    print(f"FIGURE diffusers WanImageToVideoPipeline {name}: final latents rel L2 {r:.3g}")
    if other_image:  # once: a tool run costs seconds
        wrong = ours([other] + images[1:], "other")
        u.check(u.rel(ref, wrong["latents"]) > 1e-3, f"{name}: sampling from another image fails the comparison")


m22, d22 = transformer("wan22_i2v")
compare("Wan 2.2 I2V layout", m22, d22, [first], other_image=True)
compare("Wan 2.2 I2V layout, first and last image", m22, d22, [first, last])
m21, d21 = transformer("wan21_i2v", image_dim=32, added_kv_proj_dim=32)
compare("Wan 2.1 I2V with the CLIP image encoder", m21, d21, [first], encoder=True)
# FLF2V: the first and last images' states (17 tokens each of the tiny CLIP) through pos_embed_seq_len 34.
mflf, dflf = transformer("wan21_flf2v", image_dim=32, added_kv_proj_dim=32, pos_embed_seq_len=34)
compare("Wan 2.1 FLF2V with the CLIP image encoder", mflf, dflf, [first, last], encoder=True)
# Wan 2.2 TI2V 5B (expand_timesteps): the image's latents through the tiny Wan 2.2 VAE (8 channels, 16x
# spatial) are the clean first latent frame, its tokens at timestep 0.
m_ti2v = diffusers.WanTransformer3DModel.from_pretrained(u.reference_dir("dit", "wan22_ti2v_tiny")).eval()
compare("Wan 2.2 TI2V 5B layout (expand_timesteps)", m_ti2v, u.reference_dir("dit", "wan22_ti2v_tiny"), [first],
        expand=True, latent="8x3x4x6", vae_at=u.reference_dir("wan_vae", "tiny_wan22"))


def cogvideox(name, folder, text_rows, latent, other_image=False):
    """CogVideoXImageToVideoPipeline(output_type="latent") from the pipeline's own generator (image posterior,
    noise, DPM draws) vs `videotrain-model sample` with the family's default sampler (dpm)."""
    model_dir = u.reference_dir("dit", folder)
    model = diffusers.CogVideoXTransformer3DModel.from_pretrained(model_dir).eval()
    # CogVideoX-5b-I2V's scheduler_config.json, here as the DPM scheduler ddpsampler picks by default.
    sched = diffusers.CogVideoXDPMScheduler(
        beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False, set_alpha_to_one=True,
        prediction_type="v_prediction", rescale_betas_zero_snr=True, snr_shift_scale=1.0, timestep_spacing="trailing")
    vae_at = u.reference_dir("cogvideox_vae", "tiny_a")
    pipe = diffusers.CogVideoXImageToVideoPipeline(tokenizer=None, text_encoder=None, scheduler=sched, transformer=model,
                                                   vae=diffusers.AutoencoderKLCogVideoX.from_pretrained(vae_at).eval())
    gt = torch.Generator().manual_seed(9)
    pe, ne = torch.randn(1, text_rows, 32, generator=gt), torch.randn(1, text_rows, 32, generator=gt)
    steps = []

    def keep(p, i, t, cb):
        steps.append(cb["latents"].clone())
        return cb

    with torch.no_grad():
        ref = pipe(image=pil(first), prompt_embeds=pe, negative_prompt_embeds=ne, height=HEIGHT, width=WIDTH,
                   num_frames=FRAMES, num_inference_steps=3, guidance_scale=G, use_dynamic_cfg=False,
                   generator=torch.Generator("cpu").manual_seed(SEED), output_type="latent",
                   callback_on_step_end=keep).frames

    def ours(img, tag):
        inp = os.path.join(tmp.name, f"{folder}-{tag}-in.safetensors")
        st.save_file({"prompt_embeds": pe, "negative_prompt_embeds": ne, "image": img.contiguous()}, inp)
        out = os.path.join(tmp.name, f"{folder}-{tag}.safetensors")
        u.run(tool, "sample", model_dir, inp, out, "--latent", latent, "--steps", 3, "--shift", 1.0, "--guidance", G,
              "--seed", SEED, "--vae", vae_at)
        return st.load_file(out)

    got = ours(first, "same")
    rs = [u.rel(steps[k], got["latents_after_step"][k]) for k in range(3)]
    u.check(max(rs) <= TOL, f"{name}: each of the 3 DPM steps within {TOL:g} of CogVideoXImageToVideoPipeline's "
                            f"(worst {max(rs):.3g})")
    r = u.close(ref, got["latents"], TOL, f"{name}: final latents [{', '.join(map(str, ref.shape))}] vs "
                                          "CogVideoXImageToVideoPipeline")
    print(f"FIGURE diffusers CogVideoXImageToVideoPipeline {name}: final latents rel L2 {r:.3g}")
    if other_image:
        u.check(u.rel(ref, ours(other, "other")["latents"]) > 1e-3, f"{name}: another image fails the comparison")


cogvideox("CogVideoX-5b-I2V layout", "cogvideox_5b_i2v_tiny", 226, "4x3x8x12", other_image=True)
cogvideox("CogVideoX1.5-5B-I2V layout (patch_size_t 2, ofs)", "cogvideox15_i2v_tiny", 16, "4x3x8x12")
u.finish()
