#!/usr/bin/env python3
"""diffusers' AutoencoderKLWan (2.1 layout; 2.2 layout with patch_size 2, is_residual and its own
decoder_base_dim) and AutoencoderKLCogVideoX against `videotrain-model vae encode|decode`, which runs
vaeencoder's engine and vaedecoder's decoder: tiny configs made live by diffusers (seeded random init,
every parameter then jittered so that norms are not identity; save_pretrained in float32), a batch of
two clips long enough for several temporal chunks. Encode: moments (latent_dist.parameters), mean
(mode) and the normalized latents the pipelines feed the transformer; decode of latents as given and
of normalized latents as the pipelines denormalize them. Each within 1e-5 relative L2 in float32. A
perturbed copy of our output must fail the same comparison."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import interop_util as u  # noqa: E402

torch, diffusers, st = u.need("torch", "diffusers", "safetensors.torch")

TOL = 1e-5
tool = u.tool("videotrain-model")
torch.set_grad_enabled(False)


def jitter(model, seed):
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model.eval().float()


def wan21(seed):
    g = torch.Generator().manual_seed(seed)
    return diffusers.AutoencoderKLWan(
        base_dim=16, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1, attn_scales=[],
        temperal_downsample=[False, True, True], dropout=0.0,
        latents_mean=torch.randn(4, generator=g).tolist(), latents_std=(0.5 + torch.rand(4, generator=g)).tolist())


def wan22(seed):
    g = torch.Generator().manual_seed(seed)
    return diffusers.AutoencoderKLWan(
        base_dim=16, decoder_base_dim=24, z_dim=8, dim_mult=[1, 2, 2, 2], num_res_blocks=2, attn_scales=[],
        temperal_downsample=[False, True, True], dropout=0.0, is_residual=True, in_channels=12, out_channels=12,
        patch_size=2, scale_factor_temporal=4, scale_factor_spatial=16,
        latents_mean=torch.randn(8, generator=g).tolist(), latents_std=(0.5 + torch.rand(8, generator=g)).tolist())


def cogvideox(seed):
    return diffusers.AutoencoderKLCogVideoX(
        in_channels=3, out_channels=3, down_block_types=["CogVideoXDownBlock3D"] * 4,
        up_block_types=["CogVideoXUpBlock3D"] * 4, block_out_channels=[16, 32, 32, 32], latent_channels=4,
        layers_per_block=1, norm_num_groups=4, temporal_compression_ratio=4, scaling_factor=1.15258426)


def normalize(vae, mean):
    """The latents the pipelines and trainers hand the transformer (and vaeencoder emits)."""
    c = vae.config
    if "latents_mean" in c and c.latents_mean is not None and "z_dim" in c:
        m = torch.tensor(c.latents_mean).view(1, -1, 1, 1, 1)
        s = torch.tensor(c.latents_std).view(1, -1, 1, 1, 1)
        return (mean - m) / s
    return mean * c.scaling_factor


def denormalize(vae, latents):
    """pipeline_wan / pipeline_cogvideox before vae.decode."""
    c = vae.config
    if "z_dim" in c:
        m = torch.tensor(c.latents_mean).view(1, -1, 1, 1, 1)
        inv_std = 1.0 / torch.tensor(c.latents_std).view(1, -1, 1, 1, 1)
        return latents / inv_std + m
    return latents / c.scaling_factor


def perturbed_fails(ref, ours, what, g):
    bad = ours * (1 + 1e-3 * torch.randn(ours.shape, generator=g))
    u.check(u.rel(ref, bad) > TOL, f"{what}: a 1e-3 perturbation of ours fails the check")


tmp = u.tempdir()
# (name, maker, frames, latent frames to decode): CogVideoX encodes in chunks of 8 frames (17 = 9 + 8)
# and decodes latent frames 2 at a time, the first chunk taking the odd one (5 = 3 + 2); Wan streams
# frame 0 then 4 at a time (13 = 1 + 4 + 4 + 4) and decodes one latent frame at a time.
cases = [("wan21", wan21, 13, 4), ("wan22", wan22, 9, 3), ("cogvideox", cogvideox, 17, 5)]
g = torch.Generator().manual_seed(99)
figures = []
for i, (name, make, T, t_lat) in enumerate(cases):
    torch.manual_seed(100 + i)
    vae = jitter(make(100 + i), 200 + i)
    folder = os.path.join(tmp.name, name)
    vae.save_pretrained(folder, safe_serialization=True)
    info = u.run(tool, "info", folder)
    u.check(type(vae).__name__ in info.stdout, f"{name}: info names {type(vae).__name__}")

    video = torch.rand((2, 3, T, 64, 96), generator=g) * 2 - 1
    dist = vae.encode(video).latent_dist
    inp, out = os.path.join(tmp.name, "in.safetensors"), os.path.join(tmp.name, "out.safetensors")
    st.save_file({"sample": video}, inp)
    u.run(tool, "vae", "encode", folder, inp, out)
    ours = st.load_file(out)
    for key, ref in (("moments", dist.parameters), ("mean", dist.mode()), ("latents", normalize(vae, dist.mode()))):
        r = u.close(ref, ours[key], TOL, f"{name}: encode {key} {list(ref.shape)}")
        figures.append(f"{name} encode {key}: rel L2 {r:.3g}")
    perturbed_fails(dist.parameters, ours["moments"], f"{name} encode", g)

    C, s = dist.mode().shape[1], vae.spatial_compression_ratio if hasattr(vae, "spatial_compression_ratio") else 8
    z = torch.randn((2, C, t_lat, 64 // s, 96 // s), generator=g)
    for what, feed, extra in (("latents", z, []), ("normalized latents", z, ["--normalized"])):
        ref = vae.decode(denormalize(vae, feed) if extra else feed).sample
        st.save_file({"latents": feed}, inp)
        u.run(tool, "vae", "decode", folder, inp, out, *extra)
        got = st.load_file(out)["sample"]
        r = u.close(ref, got, TOL, f"{name}: decode of {what} {list(feed.shape)} -> {list(ref.shape)}")
        inside = (ref.abs() < 0.999).float().mean().item()
        u.check(inside > 0.2, f"{name}: {inside:.0%} of the decoded values are inside (-1, 1), not all clamped")
        figures.append(f"{name} decode {what}: rel L2 {r:.3g}")
        perturbed_fails(ref, got, f"{name} decode {what}", g)

# Wrong input says what to give.
st.save_file({"input_ids": torch.zeros(1, 4, dtype=torch.int64)}, inp)
p = u.run(tool, "vae", "encode", os.path.join(tmp.name, "wan21"), inp, out, check=False)
u.check(p.returncode == 1 and "sample [B, 3, T, H, W]" in p.stderr, "encode without `sample` says what to give")
p = u.run(tool, "forward", os.path.join(tmp.name, "wan21"), inp, out, check=False)
u.check(p.returncode == 1 and "vae encode|decode" in p.stderr, "forward on a VAE folder points to `vae encode|decode`")
for f in figures:
    print("FIGURE diffusers", f)
u.finish()
