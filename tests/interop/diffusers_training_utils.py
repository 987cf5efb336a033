#!/usr/bin/env python3
"""ddptrainsink's timestep sampling and loss weighting (native Wan models) against diffusers'
training_utils, live: through `videotrain-model timesteps --ids`, each sample's generator seed (seed,
sample id, epoch), its first draw, u, shift, sigma and weight as draw_flow draws them for training.

- Densities: compute_density_for_timestep_sampling(scheme, 1, logit_mean, logit_std, mode_scale,
  generator=torch.Generator().manual_seed(<the sample's generator seed>)) under torch.float64 (so that
  torch.rand / torch.normal draw the float64 number ours draws) equals our u within 1e-12, for
  uniform, logit_normal (two mean/std pairs) and mode (two scales); the generator's first number
  equals our draw within 1e-12.
- Shifts: FlowMatchEulerDiscreteScheduler.time_shift, linear with mu = flow-shift (the static shift),
  and exponential with mu = calculate_shift(frame tokens) (timestep-sampling=shifted; FLUX's
  calculate_shift defaults) gives our sigma from diffusers' u within 1e-12.
- Weights: compute_loss_weighting_for_sd3(none|sigma_sqrt|cosmap, our float64 sigmas) equals our
  weight within 1e-6 relative (diffusers casts sigma_sqrt to float32).
A changed logit-mean, another epoch, and a perturbed shift each fail the same comparisons."""
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import interop_util as u  # noqa: E402

torch, training_utils, diffusers = u.need("torch", "diffusers.training_utils", "diffusers")
from diffusers.pipelines.flux.pipeline_flux import calculate_shift  # noqa: E402

tool = u.tool("videotrain-model")
IDS = list(range(0, 40)) + [12345678901, 2**40 + 3]


def ours(sampling, weighting="none", seed=11, epoch=2, latent="16x1x60x104", **kw):
    args = [tool, "timesteps", "--ids", ",".join(map(str, IDS)), "--seed", seed, "--epoch", epoch,
            "--sampling", sampling, "--weighting", weighting, "--latent", latent]
    for k, v in kw.items():
        args += ["--" + k.replace("_", "-"), v]
    p = u.run(*args)
    return json.loads(p.stdout)


def density(scheme, gseed, logit_mean=0.0, logit_std=1.0, mode_scale=1.29):
    g = torch.Generator().manual_seed(gseed)
    return training_utils.compute_density_for_timestep_sampling(
        scheme, 1, logit_mean=logit_mean, logit_std=logit_std, mode_scale=mode_scale, generator=g)[0].item()


def first_draw(normal, gseed):
    g = torch.Generator().manual_seed(gseed)
    return (torch.randn(1, generator=g) if normal else torch.rand(1, generator=g)).item()


def time_shift(kind, mu, us):
    sched = diffusers.FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, time_shift_type=kind)
    return sched.time_shift(mu, 1.0, torch.tensor(us, dtype=torch.float64)).tolist()


def worst(a, b):
    return max(abs(x - y) for x, y in zip(a, b))


torch.set_default_dtype(torch.float64)
cases = [("uniform", "uniform", {}), ("logit-normal", "logit_normal", {}),
         ("logit-normal", "logit_normal", {"logit_mean": 0.4, "logit_std": 1.7}),
         ("mode", "mode", {}), ("mode", "mode", {"mode_scale": 0.5}), ("shifted", "logit_normal", {"logit_std": 1.3})]
figures = []
for sampling, scheme, kw in cases:
    for shift in (1.0, 3.0):
        if sampling == "shifted" and shift != 3.0:
            continue
        tag = f"{sampling} {kw} flow-shift {shift:g}"
        out = ours(sampling, flow_shift=shift, **kw)
        s = out["samples"]
        u.check([x["id"] for x in s] == IDS, f"{tag}: one entry per sample id")
        normal = sampling in ("logit-normal", "shifted")
        dd = worst([first_draw(normal, x["generator_seed"]) for x in s], [x["draw"] for x in s])
        u.check(dd <= 1e-12, f"{tag}: each sample's first draw is its generator's torch.{'randn' if normal else 'rand'} "
                             f"(worst {dd:.3g}; LibTorch versions may differ in the last bit of a normal)")
        ref_u = [density(scheme, x["generator_seed"], **kw) for x in s]
        du = worst(ref_u, [x["u"] for x in s])
        u.check(du <= 1e-12, f"{tag}: u equals compute_density_for_timestep_sampling('{scheme}') on the same generator "
                             f"(worst {du:.3g})")
        if sampling == "shifted":
            tokens = out["frame_tokens"]
            u.check(tokens == 30 * 52, f"{tag}: 60x104 latents count {tokens} frame tokens (30 x 52)")
            mu = calculate_shift(tokens)
            ref_sigma = time_shift("exponential", mu, ref_u)
            u.check(abs(s[0]["shift"] - math.exp(mu)) <= 1e-12, f"{tag}: shift exp(calculate_shift({tokens})) = {math.exp(mu):.6g}")
        else:
            ref_sigma = time_shift("linear", shift, ref_u)
        ds = worst(ref_sigma, [x["sigma"] for x in s])
        u.check(ds <= 1e-12, f"{tag}: sigma equals diffusers' time_shift of diffusers' u (worst {ds:.3g})")
        figures.append((tag, du, ds))

# Loss weights on our sigmas, and the float32 weights training multiplies by.
for weighting, scheme in (("none", "none"), ("sigma-sqrt", "sigma_sqrt"), ("cosmap", "cosmap")):
    out = ours("uniform", weighting=weighting)
    s = out["samples"]
    ref = training_utils.compute_loss_weighting_for_sd3(scheme, sigmas=torch.tensor([x["sigma"] for x in s])).tolist()
    r = max(abs(a - x["weight"]) / abs(a) for a, x in zip(ref, s))
    u.check(r <= 1e-6, f"loss-weighting={weighting}: weights equal compute_loss_weighting_for_sd3('{scheme}') (worst rel {r:.3g})")
    r32 = max(abs(x["weight"] - x["loss_weight_float32"]) / x["weight"] for x in s)
    u.check(r32 <= 1e-6, f"loss-weighting={weighting}: the float32 weight training uses within 1e-6 (worst rel {r32:.3g})")
    figures.append((f"loss-weighting {weighting}", r, r32))

# What must fail: another logit-mean, another epoch, another shift.
base = ours("logit-normal")["samples"]
moved = ours("logit-normal", logit_mean=0.1)["samples"]
u.check(worst([density("logit_normal", x["generator_seed"]) for x in base], [x["u"] for x in moved]) > 1e-3,
        "a logit-mean of 0.1 instead of 0 fails the density comparison")
other = ours("logit-normal", epoch=3)["samples"]
u.check(sum(a["generator_seed"] != b["generator_seed"] and a["u"] != b["u"] for a, b in zip(base, other)) == len(IDS),
        "another epoch gives every sample another generator and another u")
wrong = time_shift("linear", 3.05, [x["u"] for x in base])
u.check(worst(wrong, [x["sigma"] for x in base]) > 1e-4, "a shift of 3.05 instead of 3 fails the sigma comparison")

for tag, a, b in figures:
    print(f"FIGURE diffusers training_utils {tag}: worst {a:.3g}, {b:.3g}")
u.finish()
