"""Wan 2.1 I2V's image path against diffusers' WanTransformer3DModel computed live: a folder
diffusers writes (random weights, every parameter perturbed so that the norms' weights and FLF2V's
pos_embed count) in the I2V layout (image_dim, added_kv_proj_dim, 12 input channels) and the FLF2V
one (pos_embed_seq_len: two images per sample), run by `videotrain-model forward --backward`: the
output, the gradients of every input (the image states' too) and of every parameter. The text is
512 rows as the Wan pipelines pass it (zero past the caption), which is where diffusers' processor
splits the image tokens off; one case of 300 rows checks its slicing rule for a shorter context.
Also: `videotrain-model init` writes I2V folders diffusers loads with nothing missing or unexpected,
and `videotrain-model info` says the folder is image-to-video with its image_dim and what training takes."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import interop_util as u  # noqa: E402

torch, diffusers, st = u.need("torch", "diffusers", "safetensors.torch")
OUT_TOL, PARAM_TOL = 1e-5, 1e-4


def make_inputs(cfg, text_len, images_per_sample, seed):
    g = torch.Generator().manual_seed(seed)
    text = torch.randn(2, text_len, cfg["text_dim"], generator=g)
    if text_len == 512:  # the pipelines' zero padding past each caption (elsewhere the text rows past the
        text[0, 9:] = 0  # split would all be equal, and the text keys' gradients zero up to rounding)
        text[1, 20:] = 0
    return {"hidden_states": torch.randn(2, cfg["in_channels"], 3, 8, 12, generator=g),
            "timestep": torch.tensor([700.0, 90.0]),
            "encoder_hidden_states": text,
            "encoder_hidden_states_image": torch.randn(2 * images_per_sample, 5, cfg["image_dim"], generator=g)}


def check_case(tmp, name, cfg, text_len):
    torch.manual_seed(3)
    model = diffusers.WanTransformer3DModel(**{k: v for k, v in cfg.items() if not k.startswith("_")})
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    folder = os.path.join(tmp.name, name)
    model.save_pretrained(folder)
    images = 2 if cfg.get("pos_embed_seq_len") else 1
    t = make_inputs(cfg, text_len, images, seed=len(name) + text_len)
    leaves = {k: t[k].clone().requires_grad_(True) for k in ("hidden_states", "encoder_hidden_states",
                                                             "encoder_hidden_states_image")}
    y = model(hidden_states=leaves["hidden_states"], timestep=t["timestep"],
              encoder_hidden_states=leaves["encoder_hidden_states"],
              encoder_hidden_states_image=leaves["encoder_hidden_states_image"], return_dict=False)[0]
    t["cotangent"] = torch.randn(y.shape, generator=torch.Generator().manual_seed(4))
    (y * t["cotangent"]).sum().backward()
    inp, out = os.path.join(tmp.name, f"{name}-{text_len}-in.safetensors"), os.path.join(tmp.name, f"{name}-{text_len}-out.safetensors")
    st.save_file({k: v.contiguous() for k, v in t.items()}, inp)
    u.run(u.tool("videotrain-model"), "forward", folder, inp, out, "--backward")
    ours = st.load_file(out)
    what = f"{name} (text {text_len} rows)"
    u.close(y.detach(), ours["output"], OUT_TOL, f"{what}: output, diffusers vs videotrain-model forward")
    for k, v in leaves.items():
        u.close(v.grad, ours["grad." + k], OUT_TOL, f"{what}: d/d {k}")
    worst, worst_name, n = 0.0, "", 0
    for pname, p in model.named_parameters():
        r = u.rel(p.grad, ours["grad." + pname])
        n += 1
        if r > worst:
            worst, worst_name = r, pname
    image_path = [k for k, _ in model.named_parameters() if "image_embedder" in k or "add_" in k or "norm_added_k" in k]
    u.check(n > 40 and len(image_path) >= 9, f"{what}: {n} parameter gradients compared, {len(image_path)} of the image path")
    u.check(worst <= PARAM_TOL, f"{what}: every parameter gradient, worst rel L2 {worst:.3g} ({worst_name}) "
                                f"(tolerance {PARAM_TOL:g})")
    # The image path is live: its gradients are not zero at 512 rows of text.
    if text_len == 512:
        g = model.blocks[0].attn2.add_k_proj.weight.grad.norm().item()
        u.check(g > 1e-3, f"{what}: attn2.add_k_proj's gradient is not zero ({g:.3g})")


def main():
    tmp = u.tempdir()
    with open(u.reference_dir("dit", "wan21_i2v_tiny", "config.json")) as f:
        i2v = json.load(f)
    flf2v = dict(i2v, pos_embed_seq_len=10)  # two images of 5 tokens
    for name, cfg in (("wan21_i2v", i2v), ("wan21_flf2v", flf2v)):
        check_case(tmp, name, cfg, 512)
        # Our writer: diffusers loads it whole; info names the layout.
        cfg_path = os.path.join(tmp.name, name + "-config.json")
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        folder = os.path.join(tmp.name, name + "-init")
        u.run(u.tool("videotrain-model"), "init", cfg_path, folder, "--seed", "7")
        _, info = diffusers.WanTransformer3DModel.from_pretrained(folder, output_loading_info=True)
        bad = {k: v for k, v in info.items() if v}
        u.check(not bad, f"{name}: from_pretrained loads our folder with nothing missing, unexpected or mismatched {bad or ''}")
        p = u.run(u.tool("videotrain-model"), "info", folder)
        u.check(f"image_dim {cfg['image_dim']}" in p.stdout and ("FLF2V" in p.stdout) == (name == "wan21_flf2v"),
                f"{name}: videotrain-model info says image-to-video, image_dim {cfg['image_dim']}")
        images = 2 if name == "wan21_flf2v" else 1
        u.check(f"imageencoder's image_embeds [{images}, N, {cfg['image_dim']}]" in p.stdout,
                f"{name}: info says what the trainer takes (image_embeds [{images}, N, {cfg['image_dim']}])")
    check_case(tmp, "wan21_i2v", i2v, 300)
    u.finish()


if __name__ == "__main__":
    main()
