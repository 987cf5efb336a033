#!/usr/bin/env python3
"""Writes timesteps.json beside this file: what each sample's timestep draw, shift, sigma and loss
weight must be for ddptrainsink's native flow (Wan) training, computed with plain PyTorch and the
published formulas (not with this project's code):

- generator seed: the project's per-sample seed (elements/common/seeded_hash.h sample_noise_seed:
  splitmix64-based hash_combine of seed, sample id, epoch, top bit cleared), ported below;
- first draw: torch.Generator().manual_seed(that seed), then torch.rand(1, float64) or
  torch.randn(1, float64);
- u: diffusers' compute_density_for_timestep_sampling formulas (SD3 paper, section 3.1 and B.4):
  sigmoid(mean + std n); 1 - r - s (cos^2(pi r / 2) - 1 + r); r;
- shift: flow-shift, or exp(mu) with mu linear in (h/2)(w/2) tokens from 0.5 at 256 to 1.15 at 4096
  (diffusers' calculate_shift defaults), sigma = (lo + (hi - lo) s u / (1 + (s - 1) u)) / 1000;
- weight: SD3's sigma^-2 (sigma_sqrt) and 2 / (pi (1 - 2 sigma + 2 sigma^2)) (cosmap);
- loss: mean over samples of w_i mean((pred_i - target_i)^2) on seeded random pred/target.

Run with any PyTorch (python3 tests/reference/timesteps/make_timesteps.py); the numbers do not depend
on its version beyond the last bit of a normal draw (the test allows 1e-12)."""
import json
import math
import os

import torch

M64 = (1 << 64) - 1


def mix64(x):
    z = (x + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def hash_combine(a, b):
    return mix64(a ^ mix64((b + 0x632BE59BD9B4E019) & M64))


def generator_seed(seed, sample_id, epoch):
    return hash_combine(hash_combine(seed, sample_id), epoch) & 0x7FFFFFFFFFFFFFFF


def sample(case, sample_id):
    gseed = generator_seed(case["seed"], sample_id, case["epoch"])
    g = torch.Generator().manual_seed(gseed)
    normal = case["sampling"] in ("logit-normal", "shifted", "auto")
    draw = (torch.randn(1, dtype=torch.float64, generator=g) if normal
            else torch.rand(1, dtype=torch.float64, generator=g)).item()
    if normal:
        u = 1 / (1 + math.exp(-(case["logit_mean"] + case["logit_std"] * draw)))
    elif case["sampling"] == "mode":
        u = 1 - draw - case["mode_scale"] * (math.cos(math.pi * draw / 2) ** 2 - 1 + draw)
    else:
        u = draw
    if case["sampling"] == "shifted":
        h, w = case["latent"][2], case["latent"][3]
        tokens = (h // 2) * (w // 2)
        m = (1.15 - 0.5) / (4096 - 256)
        shift = math.exp(tokens * m + 0.5 - m * 256)
    else:
        shift = case["flow_shift"]
    lo, hi = case["range"]
    sigma = (lo + (hi - lo) * shift * u / (1 + (shift - 1) * u)) / 1000
    if case["weighting"] == "sigma-sqrt":
        weight = max(sigma, 1e-3) ** -2
    elif case["weighting"] == "cosmap":
        weight = 2 / (math.pi * (1 - 2 * sigma + 2 * sigma * sigma))
    else:
        weight = 1.0
    return {"id": sample_id, "generator_seed": gseed, "draw": draw, "u": u, "shift": shift, "sigma": sigma,
            "weight": weight}


def case(sampling, **kw):
    c = {"sampling": sampling, "seed": 11, "epoch": 2, "logit_mean": 0.0, "logit_std": 1.0, "mode_scale": 1.29,
         "flow_shift": 3.0, "range": [0.0, 1000.0], "weighting": "none", "latent": [16, 1, 60, 104],
         "ids": [0, 1, 2, 3, 4, 5, 6, 7, 1000003, 2**40 + 3]}
    c.update(kw)
    c["samples"] = [sample(c, i) for i in c["ids"]]
    return c


def main():
    cases = [
        case("auto"),  # the default: logit-normal, flow-shift 3 (unchanged from before these options)
        case("uniform", flow_shift=1.0),
        case("logit-normal", logit_mean=0.4, logit_std=1.7, weighting="cosmap"),
        case("mode", weighting="sigma-sqrt"),
        case("mode", mode_scale=-0.5, range=[875.0, 1000.0], epoch=0),
        case("shifted", latent=[16, 1, 90, 160], weighting="cosmap", seed=3),
    ]

    g = torch.Generator().manual_seed(5)
    pred = torch.randn(3, 2, 2, 3, 4, generator=g, dtype=torch.float64)
    target = torch.randn(3, 2, 2, 3, 4, generator=g, dtype=torch.float64)
    sigmas = [0.0004, 0.37, 0.93]
    losses = {}
    for weighting in ("none", "sigma-sqrt", "cosmap"):
        if weighting == "sigma-sqrt":
            w = torch.tensor([max(s, 1e-3) ** -2 for s in sigmas], dtype=torch.float64)
        elif weighting == "cosmap":
            w = torch.tensor([2 / (math.pi * (1 - 2 * s + 2 * s * s)) for s in sigmas], dtype=torch.float64)
        else:
            w = torch.ones(3, dtype=torch.float64)
        losses[weighting] = (w.view(3, 1) * (pred - target).pow(2).flatten(1)).mean(1).mean().item()

    out = {"cases": cases,
           "loss": {"shape": list(pred.shape), "pred": pred.flatten().tolist(), "target": target.flatten().tolist(),
                    "sigmas": sigmas, "losses": losses}}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "timesteps.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print("wrote", path)


if __name__ == "__main__":  # generate.py of wan_i2v_condition imports the port above
    main()
