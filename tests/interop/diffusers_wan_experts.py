#!/usr/bin/env python3
"""Wan 2.2 A14B's two-expert sampling (ddpsampler with a model-2 trainer) against diffusers' own
WanPipeline(transformer, transformer_2, boundary_ratio) on the same tiny folders, prompt embeddings and
seeded noise: `videotrain-model sample --model-2` runs ddpsampler's loop (sample_latents_2). The
experts: tests/reference/dit/wan_t2v_tiny and a perturbed copy saved by diffusers. Each step's latents
within 1e-5 relative L2 for UniPC and Euler, with the boundary inside the run and guidance_scale_2 !=
guidance_scale; sampling through the first expert alone must fail the same comparison."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import interop_util as u  # noqa: E402

torch, diffusers, st = u.need("torch", "diffusers", "safetensors.torch")

tool = u.tool("videotrain-model")
TOL = 1e-5
BOUNDARY, STEPS, G1, G2, SEED = 0.875, 8, 5.0, 3.0, 42
HEIGHT, WIDTH, FRAMES = 64, 96, 9  # latents [1, 4, 3, 8, 12] (no VAE: factors 8 and 4)

tmp = u.tempdir()
high_dir = u.reference_dir("dit", "wan_t2v_tiny")
low_dir = os.path.join(tmp.name, "transformer_2")
high = diffusers.WanTransformer3DModel.from_pretrained(high_dir).eval()
low = diffusers.WanTransformer3DModel.from_pretrained(high_dir).eval()
g = torch.Generator().manual_seed(5)
with torch.no_grad():
    for p in low.parameters():
        p.add_(0.05 * torch.randn(p.shape, generator=g))
low.save_pretrained(low_dir)

prompt = torch.zeros(1, 16, 32)
prompt[:, :10] = torch.randn(1, 10, 32, generator=g)
negative = torch.zeros(1, 16, 32)
negative[:, :1] = torch.randn(1, 1, 32, generator=g)
inp = os.path.join(tmp.name, "in.safetensors")
st.save_file({"prompt_embeds": prompt, "negative_prompt_embeds": negative}, inp)


def unipc():
    # Wan-AI/Wan2.2-T2V-A14B-Diffusers scheduler/scheduler_config.json, at flow_shift 3.
    return diffusers.UniPCMultistepScheduler(
        num_train_timesteps=1000, beta_start=0.0001, beta_end=0.02, beta_schedule="linear", solver_order=2,
        prediction_type="flow_prediction", thresholding=False, predict_x0=True, solver_type="bh2",
        lower_order_final=True, disable_corrector=[], use_flow_sigmas=True, flow_shift=3.0,
        final_sigmas_type="zero", timestep_spacing="linspace", steps_offset=0)


for kind, sched in (("unipc", unipc()), ("euler", diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0))):
    pipe = diffusers.WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=sched, transformer=high,
                                 transformer_2=low, boundary_ratio=BOUNDARY)
    steps = []

    def keep(p, i, t, kw):
        steps.append(kw["latents"].clone())
        return kw

    with torch.no_grad():
        ref = pipe(prompt_embeds=prompt, negative_prompt_embeds=negative, height=HEIGHT, width=WIDTH,
                   num_frames=FRAMES, num_inference_steps=STEPS, guidance_scale=G1, guidance_scale_2=G2,
                   generator=torch.Generator("cpu").manual_seed(SEED), output_type="latent",
                   callback_on_step_end=keep).frames
    ts = pipe.scheduler.timesteps
    n_high = int((ts >= BOUNDARY * 1000).sum())
    u.check(0 < n_high < STEPS, f"{kind}: the boundary falls inside the run ({n_high} of {STEPS} steps on transformer)")
    out = os.path.join(tmp.name, f"{kind}.safetensors")
    u.run(tool, "sample", high_dir, inp, out, "--latent", "4x3x8x12", "--model-2", low_dir, "--boundary-ratio", BOUNDARY,
          "--sampler", kind, "--steps", STEPS, "--shift", 3.0, "--guidance", G1, "--guidance-2", G2, "--seed", SEED)
    ours = st.load_file(out)
    rs = [u.rel(steps[k], ours["latents_after_step"][k]) for k in range(STEPS)]
    u.check(max(rs) <= TOL, f"{kind}: each of the {STEPS} steps within {TOL:g} of WanPipeline's (worst {max(rs):.3g})")
    r = u.close(ref, ours["latents"], TOL, f"{kind}: final latents vs WanPipeline(transformer, transformer_2)")
    print(f"FIGURE diffusers WanPipeline two experts {kind}: final latents rel L2 {r:.3g}")
    one = os.path.join(tmp.name, f"{kind}-one.safetensors")
    u.run(tool, "sample", high_dir, inp, one, "--latent", "4x3x8x12", "--sampler", kind, "--steps", STEPS,
          "--shift", 3.0, "--guidance", G1, "--seed", SEED)
    u.check(u.rel(ref, st.load_file(one)["latents"]) > 1e-3, f"{kind}: the first expert alone fails the comparison")
u.finish()
