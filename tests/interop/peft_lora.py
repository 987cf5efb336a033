"""LoRAs that peft and diffusers write load in ours and give peft's forward and gradients.

A diffusers transformer (a folder `videotrain-model init` wrote) gets a peft LoraConfig adapter
(lora_alpha != r, B made nonzero); its get_peft_model_state_dict is saved by
WanPipeline.save_lora_weights / CogVideoXPipeline.save_lora_weights with the config as metadata (the
diffusers training scripts' file) and by the model's save_lora_adapter (bare PEFT keys and config).
`videotrain-model forward --lora FILE --backward` on each gives peft's output, the inputs' gradients
(rel L2 <= 1e-5) and the LoRA tensors' gradients. Configs: plain, and use_rslora with an alpha_pattern."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import interop_util as u  # noqa: E402

torch, diffusers, peft, st = u.need("torch", "diffusers", "peft", "safetensors.torch")
TOL, GRAD_TOL = 1e-5, 1e-4
MODEL = u.tool("videotrain-model")


def inputs(kind, cfg):
    g = torch.Generator().manual_seed(4)
    if kind == "wan":
        x = torch.randn(2, cfg["in_channels"], 3, 8, 12, generator=g)
        e = torch.randn(2, 7, cfg["text_dim"], generator=g)
    else:
        x = torch.randn(2, 3, cfg["in_channels"], 8, 12, generator=g)
        e = torch.randn(2, cfg["max_text_seq_length"], cfg["text_embed_dim"], generator=g)
    return {"hidden_states": x, "timestep": torch.tensor([300.0, 900.0]), "encoder_hidden_states": e}


def forward(kind, model, t):
    if kind == "wan":
        return model(hidden_states=t["hidden_states"], timestep=t["timestep"],
                     encoder_hidden_states=t["encoder_hidden_states"], return_dict=False)[0]
    return model(hidden_states=t["hidden_states"], encoder_hidden_states=t["encoder_hidden_states"],
                 timestep=t["timestep"], return_dict=False)[0]


def main():
    tmp = u.tempdir()
    figures = []
    cases = [
        ("wan", "wan_t2v_tiny", diffusers.WanTransformer3DModel, diffusers.WanPipeline,
         dict(r=4, lora_alpha=12, target_modules=["to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj", "ffn.net.2",
                                                  "proj_out"])),
        ("wan", "wan_t2v_tiny", diffusers.WanTransformer3DModel, diffusers.WanPipeline,
         dict(r=4, lora_alpha=6, use_rslora=True, alpha_pattern={"ffn.net.2": 3},
              target_modules=["to_q", "to_v", "ffn.net.0.proj", "ffn.net.2"])),
        ("cogvideox", "cogvideox_2b_tiny", diffusers.CogVideoXTransformer3DModel, diffusers.CogVideoXPipeline,
         dict(r=4, lora_alpha=2, target_modules=["to_q", "to_k", "to_v", "to_out.0", "ff.net.0.proj", "ff.net.2"])),
    ]
    for ci, (kind, name, cls, pipe_cls, cfg) in enumerate(cases):
        folder = os.path.join(tmp.name, f"{name}-{ci}")
        u.run(MODEL, "init", u.reference_dir("dit", name, "config.json"), folder, "--seed", str(20 + ci))
        model = cls.from_pretrained(folder, torch_dtype=torch.float32).eval()
        config = peft.LoraConfig(**cfg)
        model.add_adapter(config)
        g = torch.Generator().manual_seed(30 + ci)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.copy_(0.1 * torch.randn(p.shape, generator=g))
        for n, p in model.named_parameters():
            p.requires_grad_("lora_" in n)  # the base frozen, as ours with --lora
        t = inputs(kind, dict(model.config))
        x = t["hidden_states"].clone().requires_grad_(True)
        e = t["encoder_hidden_states"].clone().requires_grad_(True)
        y = forward(kind, model, {**t, "hidden_states": x, "encoder_hidden_states": e})
        cot = torch.randn(y.shape, generator=torch.Generator().manual_seed(5))
        (y * cot).sum().backward()
        lora_grads = {n.replace(".default", ""): p.grad for n, p in model.named_parameters() if "lora_" in n}
        tag = f"{name} {cfg}"
        # The two files diffusers writes for a peft adapter.
        sd = peft.utils.get_peft_model_state_dict(model)
        d = os.path.join(tmp.name, f"lora-{ci}")
        pipe_cls.save_lora_weights(d, transformer_lora_layers=sd, weight_name="pipeline.safetensors",
                                   transformer_lora_adapter_metadata=config.to_dict())
        model.save_lora_adapter(d, weight_name="adapter.safetensors")
        inp = os.path.join(tmp.name, f"in-{ci}.safetensors")
        st.save_file({**t, "cotangent": cot}, inp)
        for label, f in (("save_lora_weights", "pipeline.safetensors"), ("save_lora_adapter", "adapter.safetensors")):
            out = os.path.join(d, f"out-{f}")
            u.run(MODEL, "forward", folder, inp, out, "--lora", os.path.join(d, f), "--backward")
            ours = st.load_file(out)
            what = f"{tag} via {label}"
            r = u.close(y.detach(), ours["output"], TOL, f"{what}: output, peft vs ours")
            gx = u.close(x.grad, ours["grad.hidden_states"], TOL, f"{what}: d/d hidden_states")
            ge = u.close(e.grad, ours["grad.encoder_hidden_states"], TOL, f"{what}: d/d encoder_hidden_states")
            worst = 0.0
            for n, gp in lora_grads.items():
                k = "grad.transformer." + n
                if k not in ours:
                    u.check(False, f"{what}: our gradients lack {k}")
                    continue
                worst = max(worst, u.rel(gp, ours[k]))
            u.check(worst <= GRAD_TOL, f"{what}: the {len(lora_grads)} LoRA tensors' gradients, worst rel L2 "
                                       f"{worst:.3g} (tolerance {GRAD_TOL:g})")
            figures.append((what, r, gx, ge, worst))
    print("figures (rel L2, peft vs ours): output, d/dx, d/d text, worst LoRA gradient")
    for f in figures:
        print("  " + f[0] + ": " + ", ".join(f"{v:.3g}" for v in f[1:]))
    u.finish()


if __name__ == "__main__":
    main()
