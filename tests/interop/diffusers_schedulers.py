#!/usr/bin/env python3
"""Our samplers (ddpsampler's: flow-matching Euler and UniPC for Wan, CogVideoX's DDIM and DPM)
against diffusers' schedulers, configured as the real pipelines' scheduler_config.json files
configure them: through `videotrain-model scheduler`, the timesteps (and sigmas, alphas_cumprod) of
N steps, and every step of an N-step chain on shared random model outputs, driven as WanPipeline and
CogVideoXPipeline call step() (UniPC after set_begin_index(0); DPM with the previous x0 and
timestep and one seeded generator). Integer timesteps equal, float ones within 1e-6, each step's
sample within 1e-5 relative L2. A perturbed copy of our samples must fail the same comparison."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import interop_util as u  # noqa: E402

torch, diffusers, st = u.need("torch", "diffusers", "safetensors.torch")

tool = u.tool("videotrain-model")
TOL_STEP, TOL_SCHEDULE = 1e-5, 1e-6
SHAPE = (2, 4, 3, 4, 6)


def wan_unipc(shift):
    # Wan-AI/Wan2.1-T2V-*-Diffusers scheduler/scheduler_config.json (flow_shift 3.0 at 480p, 5.0 at 720p).
    return diffusers.UniPCMultistepScheduler(
        num_train_timesteps=1000, beta_start=0.0001, beta_end=0.02, beta_schedule="linear", solver_order=2,
        prediction_type="flow_prediction", thresholding=False, predict_x0=True, solver_type="bh2",
        lower_order_final=True, disable_corrector=[], use_flow_sigmas=True, flow_shift=shift,
        final_sigmas_type="zero", timestep_spacing="linspace", steps_offset=0)


def flow_euler(shift):
    return diffusers.FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=shift)


def cogvideox(cls, snr):
    # THUDM/CogVideoX-2b (snr_shift_scale 3.0) and -5b (1.0) scheduler/scheduler_config.json.
    return cls(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
               clip_sample=False, set_alpha_to_one=True, steps_offset=0, prediction_type="v_prediction",
               clip_sample_range=1.0, sample_max_value=1.0, timestep_spacing="trailing", rescale_betas_zero_snr=True,
               snr_shift_scale=snr)


def reference(kind, sched, n, x0, outs, seed):
    sched.set_timesteps(n)
    if kind == "unipc":
        sched.set_begin_index(0)
    ts = sched.timesteps
    xs, x, old_x0 = [x0], x0, None
    gen = torch.Generator().manual_seed(seed)
    for k, t in enumerate(ts):
        if kind == "dpm":
            x, old_x0 = sched.step(outs[k], old_x0, t, ts[k - 1] if k > 0 else None, x, eta=0.0, generator=gen,
                                   return_dict=False)
        elif kind == "ddim":
            x = sched.step(outs[k], t, x, eta=0.0, generator=gen, return_dict=False)[0]
        else:
            x = sched.step(outs[k], t, x, return_dict=False)[0]
        xs.append(x)
    return ts, torch.stack(xs)


cases = [("euler", s, flow_euler) for s in (3.0, 5.0)] + [("unipc", s, wan_unipc) for s in (3.0, 5.0)] + \
        [("ddim", s, lambda s: cogvideox(diffusers.CogVideoXDDIMScheduler, s)) for s in (3.0, 1.0)] + \
        [("dpm", s, lambda s: cogvideox(diffusers.CogVideoXDPMScheduler, s)) for s in (3.0, 1.0)]

tmp = u.tempdir()
g = torch.Generator().manual_seed(7)
worst = {}
for kind, shift, make in cases:
    for n in (1, 2, 8, 25, 50):
        tag = f"{kind} shift/snr {shift:g} N={n}"
        sched = make(shift)
        x0 = torch.randn(SHAPE, generator=g)
        outs = torch.randn((n, *SHAPE), generator=g)
        seed = 1234 + n
        ts, ref = reference(kind, sched, n, x0, outs, seed)
        inp, out = os.path.join(tmp.name, "in.safetensors"), os.path.join(tmp.name, "out.safetensors")
        st.save_file({"sample": x0, "model_outputs": outs}, inp)
        u.run(tool, "scheduler", kind, out, "--steps", n, "--shift", shift, "--in", inp, "--seed", seed)
        ours = st.load_file(out)
        if ts.dtype == torch.int64:
            u.check(ours["timesteps"].dtype == torch.int64 and torch.equal(ours["timesteps"], ts),
                    f"{tag}: integer timesteps equal diffusers' {ts[:4].tolist()}...")
        else:
            u.check(ours["timesteps"].dtype == torch.float32 and u.rel(ts, ours["timesteps"]) <= TOL_SCHEDULE,
                    f"{tag}: float timesteps within {TOL_SCHEDULE:g} of diffusers' {ts[:3].tolist()}...")
        if hasattr(sched, "sigmas") and kind in ("euler", "unipc"):
            u.close(sched.sigmas.float(), ours["sigmas"], TOL_SCHEDULE, f"{tag}: sigmas")
        if kind in ("ddim", "dpm"):
            a = ours["alphas_cumprod"]
            u.check(a.dtype == torch.float64 and (a - sched.alphas_cumprod.double()).abs().max() <= 1e-12,
                    f"{tag}: alphas_cumprod (float64) within 1e-12 of diffusers'")
        rs = [u.rel(ref[k], ours["samples"][k]) for k in range(1, n + 1)]
        u.check(ours["samples"].shape == ref.shape and max(rs) <= TOL_STEP,
                f"{tag}: each of the {n} steps within {TOL_STEP:g} (worst {max(rs):.3g})")
        worst[(kind, shift)] = max(worst.get((kind, shift), 0.0), max(rs))
        bad = ours["samples"][-1] * (1 + 1e-3 * torch.randn(SHAPE, generator=g))
        u.check(u.rel(ref[-1], bad) > TOL_STEP, f"{tag}: a 1e-3 perturbation of our last sample fails the check")
for (kind, shift), r in worst.items():
    print(f"FIGURE diffusers scheduler {kind} shift/snr {shift:g}: worst step rel L2 {r:.3g} over N in 1, 2, 8, 25, 50")

# A bad sampler name says which exist.
p = u.run(tool, "scheduler", "heun", os.path.join(tmp.name, "o.safetensors"), check=False)
u.check(p.returncode == 1 and "euler" in p.stderr and "ddim" in p.stderr, "an unknown sampler names the ones there are")
u.finish()
