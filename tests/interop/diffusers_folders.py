"""Folders written by `videotrain-model init` (our writer, the one export uses) load with diffusers'
from_pretrained (WanTransformer3DModel, CogVideoXTransformer3DModel in the 2b, 1.5, 5b-I2V and 1.5-I2V layouts) with
no missing, unexpected or mismatched tensor, and diffusers' forward on them equals ours
(`videotrain-model forward --backward`): the output and the inputs' gradients in float32."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import interop_util as u  # noqa: E402

torch, diffusers, st = u.need("torch", "diffusers", "safetensors.torch")
torch.manual_seed(0)
TOL = 1e-5


def cogvideox_rotary(model, frames, h, w):
    """The rotary tables CogVideoXPipeline computes for latents of this size (1.5: patch_size_t)."""
    pipe = diffusers.CogVideoXPipeline(tokenizer=None, text_encoder=None, vae=None, transformer=model, scheduler=None)
    return pipe._prepare_rotary_positional_embeddings(h * pipe.vae_scale_factor_spatial, w * pipe.vae_scale_factor_spatial,
                                                      frames, torch.device("cpu"))


def inputs(kind, cfg):
    g = torch.Generator().manual_seed(1)
    c = cfg["in_channels"]
    if kind == "wan":
        x = torch.randn(2, c, 3, 8, 12, generator=g)
        text = torch.randn(2, 7, cfg["text_dim"], generator=g)
    else:
        frames = 4 if cfg.get("patch_size_t") else 3
        x = torch.randn(2, frames, c, 8, 12, generator=g)
        text = torch.randn(2, cfg["max_text_seq_length"], cfg["text_embed_dim"], generator=g)
    t = {"hidden_states": x, "timestep": torch.tensor([500.0, 125.0]), "encoder_hidden_states": text}
    if cfg.get("ofs_embed_dim"):  # CogVideoX1.5-I2V: an ofs other than the pipeline's 2.0 (our default)
        t["ofs"] = torch.tensor([1.5])
    return t


def diffusers_forward(kind, model, t):
    x = t["hidden_states"].clone().requires_grad_(True)
    e = t["encoder_hidden_states"].clone().requires_grad_(True)
    if kind == "wan":
        y = model(hidden_states=x, timestep=t["timestep"], encoder_hidden_states=e, return_dict=False)[0]
    else:
        rot = None
        if model.config.use_rotary_positional_embeddings:
            rot = cogvideox_rotary(model, x.shape[1], x.shape[3], x.shape[4])
        y = model(hidden_states=x, encoder_hidden_states=e, timestep=t["timestep"], image_rotary_emb=rot,
                  ofs=t.get("ofs"), return_dict=False)[0]
    (y * t["cotangent"]).sum().backward()
    return y.detach(), x.grad, e.grad


def main():
    tmp = u.tempdir()
    cases = [("wan", "wan_t2v_tiny", diffusers.WanTransformer3DModel),
             ("cogvideox", "cogvideox_2b_tiny", diffusers.CogVideoXTransformer3DModel),
             ("cogvideox", "cogvideox15_tiny", diffusers.CogVideoXTransformer3DModel),
             ("cogvideox", "cogvideox_5b_i2v_tiny", diffusers.CogVideoXTransformer3DModel),
             ("cogvideox", "cogvideox15_i2v_tiny", diffusers.CogVideoXTransformer3DModel)]
    for kind, name, cls in cases:
        folder = os.path.join(tmp.name, name)
        u.run(u.tool("videotrain-model"), "init", u.reference_dir("dit", name, "config.json"), folder, "--seed", "7")
        model, info = cls.from_pretrained(folder, torch_dtype=torch.float32, output_loading_info=True)
        model.eval()
        bad = {k: v for k, v in info.items() if v}
        u.check(not bad, f"{name}: {cls.__name__}.from_pretrained loads our folder with nothing missing, "
                         f"unexpected or mismatched {bad if bad else ''}")
        t = inputs(kind, dict(model.config))
        with torch.no_grad():
            probe = diffusers_forward_shape(kind, model, t)
        t["cotangent"] = torch.randn(probe, generator=torch.Generator().manual_seed(2))
        y, gx, ge = diffusers_forward(kind, model, t)
        inp, out = os.path.join(tmp.name, name + "-in.safetensors"), os.path.join(tmp.name, name + "-out.safetensors")
        st.save_file({k: v.contiguous() for k, v in t.items()}, inp)
        u.run(u.tool("videotrain-model"), "forward", folder, inp, out, "--backward")
        ours = st.load_file(out)
        u.close(y, ours["output"], TOL, f"{name}: output, diffusers vs videotrain-model forward")
        u.close(gx, ours["grad.hidden_states"], TOL, f"{name}: d/d hidden_states")
        u.close(ge, ours["grad.encoder_hidden_states"], TOL, f"{name}: d/d encoder_hidden_states")
    config_param_counts()
    u.finish()


def config_param_counts():
    """`videotrain-model info CONFIG.json` (docs/fine-tuning-wan.md's memory table) counts what diffusers builds from
    the published Wan configs (on the meta device: no weights): all parameters, the Linear weights and rows
    base-dtype=fp8 stores, and a rank-32 LoRA on to_q, to_k, to_v, to_out.0."""
    configs = [u.reference_dir("dit", "wan_t2v_tiny", "config.json")]
    d = os.path.join(u.source_dir(), "examples", "models", "wan_configs")
    configs += [os.path.join(d, f) for f in sorted(os.listdir(d))]
    for path in configs:
        cfg = diffusers.WanTransformer3DModel.load_config(path)
        with torch.device("meta"):
            model = diffusers.WanTransformer3DModel.from_config(cfg)
        total = sum(p.numel() for p in model.parameters())
        linears = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
        lin = sum(m.weight.numel() for _, m in linears)
        rows = sum(m.out_features for _, m in linears)
        lora = sum(32 * (m.in_features + m.out_features) for n, m in linears
                   if n.split(".")[-1] in ("to_q", "to_k", "to_v") or n.endswith("to_out.0"))
        want = f"parameters {total} ("
        want2 = f"of them Linear weights {lin} in {rows} output rows; a rank-32 LoRA on to_q, to_k, to_v, to_out.0: {lora}"
        r = u.run(u.tool("videotrain-model"), "info", path)
        u.check(want in r.stdout and want2 in r.stdout,
                f"info {os.path.basename(path)}: {total} parameters, {lin} Linear weights in {rows} rows, LoRA {lora}")


def diffusers_forward_shape(kind, model, t):
    if kind == "wan":
        return model(hidden_states=t["hidden_states"], timestep=t["timestep"],
                     encoder_hidden_states=t["encoder_hidden_states"], return_dict=False)[0].shape
    x = t["hidden_states"]
    rot = cogvideox_rotary(model, x.shape[1], x.shape[3], x.shape[4]) if model.config.use_rotary_positional_embeddings else None
    return model(hidden_states=x, encoder_hidden_states=t["encoder_hidden_states"], timestep=t["timestep"],
                 image_rotary_emb=rot, ofs=t.get("ofs"), return_dict=False)[0].shape


if __name__ == "__main__":
    main()
