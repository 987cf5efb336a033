#!/usr/bin/env python3
"""Wan 2.2 A14B's two-expert sampling loop as diffusers' WanPipeline(transformer, transformer_2,
boundary_ratio) runs it, for the Debian build's check of ddpsampler's loop (test expert-pair); the
torch2 suite recomputes the same live (tests/interop/diffusers_wan_experts.py).
Writes transformer_2/ (../dit/wan_t2v_tiny with seeded noise 0.05 * N(0, 1) added to every
parameter, generator seed 5) and experts_loop.safetensors. Run from the repository root:
    .venv-torch2/bin/python tests/reference/wan_experts/generate.py"""
import os

import diffusers
import safetensors.torch as st
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
BOUNDARY, STEPS, G1, G2, SEED = 0.875, 8, 5.0, 3.0, 42

high = diffusers.WanTransformer3DModel.from_pretrained(os.path.join(HERE, "..", "dit", "wan_t2v_tiny")).eval()
low = diffusers.WanTransformer3DModel.from_pretrained(os.path.join(HERE, "..", "dit", "wan_t2v_tiny")).eval()
g = torch.Generator().manual_seed(5)
with torch.no_grad():
    for p in low.parameters():
        p.add_(0.05 * torch.randn(p.shape, generator=g))
low.save_pretrained(os.path.join(HERE, "transformer_2"))
prompt = torch.zeros(1, 16, 32)
prompt[:, :10] = torch.randn(1, 10, 32, generator=g)
negative = torch.zeros(1, 16, 32)
negative[:, :1] = torch.randn(1, 1, 32, generator=g)
out = {"prompt_embeds": prompt, "negative_prompt_embeds": negative}
# Wan-AI/Wan2.2-T2V-A14B-Diffusers scheduler/scheduler_config.json at flow_shift 3; and Euler.
unipc = diffusers.UniPCMultistepScheduler(
    num_train_timesteps=1000, beta_start=0.0001, beta_end=0.02, beta_schedule="linear", solver_order=2,
    prediction_type="flow_prediction", thresholding=False, predict_x0=True, solver_type="bh2",
    lower_order_final=True, disable_corrector=[], use_flow_sigmas=True, flow_shift=3.0,
    final_sigmas_type="zero", timestep_spacing="linspace", steps_offset=0)
for kind, sched in (("unipc", unipc), ("euler", diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0))):
    pipe = diffusers.WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=sched, transformer=high,
                                 transformer_2=low, boundary_ratio=BOUNDARY)
    steps = []

    def keep(p, i, t, kw):
        steps.append(kw["latents"].clone())
        return kw

    with torch.no_grad():
        lat = pipe(prompt_embeds=prompt, negative_prompt_embeds=negative, height=64, width=96, num_frames=9,
                   num_inference_steps=STEPS, guidance_scale=G1, guidance_scale_2=G2,
                   generator=torch.Generator("cpu").manual_seed(SEED), output_type="latent",
                   callback_on_step_end=keep).frames
    out[f"{kind}.timesteps"] = pipe.scheduler.timesteps.float()
    out[f"{kind}.latents_after_step"] = torch.stack(steps)
    out[f"{kind}.final_latents"] = lat
out["initial_noise"] = torch.randn([1, 4, 3, 8, 12], generator=torch.Generator("cpu").manual_seed(SEED))
st.save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(HERE, "experts_loop.safetensors"),
             metadata={"seed": str(SEED), "boundary_ratio": str(BOUNDARY), "guidance": str(G1), "guidance_2": str(G2),
                       "steps": str(STEPS), "diffusers": diffusers.__version__, "torch": torch.__version__})
print("wrote", HERE)
