"""LoRA files we write, loaded by diffusers' own loaders, give diffusers' forward = ours.

A rank-4, alpha-6 LoRA with nonzero A and B (written by diffusers' WanPipeline.save_lora_weights,
plus the videotrain.linear_shapes metadata our trainer's files carry) is converted by `videotrain-model
lora convert` to each naming we write. Each file loads with
  - diffusers naming: WanPipeline.load_lora_weights and transformer.load_lora_adapter;
  - comfyui naming: WanPipeline.load_lora_weights (diffusers' _convert_non_diffusers_wan_lora_to_diffusers),
    and our ComfyUI file converted back to diffusers by our tool through load_lora_adapter;
  - kohya naming: WanPipeline.load_lora_weights (diffusers' _convert_musubi_wan_lora_to_diffusers);
and diffusers' forward with it equals `videotrain-model forward --lora FILE` (float32, rel L2 <= 1e-5),
for the default targets (attention), a set with the FFN and one with the head and embeddings. The
same for CogVideoXPipeline (diffusers naming; the ComfyUI and kohya namings are refused, naming
diffusers), and the combinations no file can satisfy are refused naming the naming that works."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import interop_util as u  # noqa: E402

torch, diffusers, st = u.need("torch", "diffusers", "safetensors.torch")
TOL = 1e-5
RANK, ALPHA = 4, 6.0
MODEL = u.tool("videotrain-model")

ATTN = ["attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "attn2.to_q", "attn2.to_k", "attn2.to_v",
        "attn2.to_out.0"]
WAN_SETS = {
    "default": lambda n: any(n.endswith(s) for s in ("to_q", "to_k", "to_v", "to_out.0")),
    "ffn": lambda n: any(n.endswith(s) for s in ("to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj", "ffn.net.2")),
    "head+embeddings": lambda n: n.endswith("to_q") or n in (
        "proj_out", "condition_embedder.time_proj", "condition_embedder.text_embedder.linear_1",
        "condition_embedder.text_embedder.linear_2", "condition_embedder.time_embedder.linear_1",
        "condition_embedder.time_embedder.linear_2"),
    "head only": lambda n: n == "proj_out",
}
COG_SETS = {
    "default": lambda n: any(n.endswith(s) for s in ("to_q", "to_k", "to_v", "to_out.0")),
    "ffn": lambda n: any(n.endswith(s) for s in ("to_q", "to_k", "to_v", "to_out.0", "ff.net.0.proj", "ff.net.2")),
    "head+embeddings": lambda n: n.endswith("to_q") or n in (
        "proj_out", "norm_out.linear", "time_embedding.linear_1", "time_embedding.linear_2", "patch_embed.text_proj"),
}


def linears(model):
    return {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


def block_pattern(name):
    for p in ("blocks.", "transformer_blocks."):
        if name.startswith(p):
            i, rest = name[len(p):].split(".", 1)
            if i.isdigit():
                return p + "{i}." + rest
    return name


def write_source(path, model, pipeline_cls, pick, seed):
    """A LoRA on the picked Linears: A ~ N(0, 1/in), B ~ 0.1 N(0, 1), saved by diffusers' writer with
    PEFT's config in the metadata; the model's Linear sizes added as our trainer's files carry them."""
    g = torch.Generator().manual_seed(seed)
    sd, targets = {}, []
    for n, m in linears(model).items():
        if pick(n):
            sd[f"{n}.lora_A.weight"] = torch.randn(RANK, m.in_features, generator=g) / m.in_features ** 0.5
            sd[f"{n}.lora_B.weight"] = 0.1 * torch.randn(m.out_features, RANK, generator=g)
            targets.append(n)
    d = os.path.dirname(path)
    pipeline_cls.save_lora_weights(d, transformer_lora_layers=sd, weight_name=os.path.basename(path),
                                   transformer_lora_adapter_metadata={"r": RANK, "lora_alpha": ALPHA,
                                                                      "target_modules": targets})
    tensors = st.load_file(path)
    with st.safe_open(path, "pt") as f:
        meta = f.metadata()
    meta["videotrain.linear_shapes"] = json.dumps(
        {block_pattern(n): [m.in_features, m.out_features] for n, m in linears(model).items()})
    st.save_file(tensors, path, metadata=meta)
    return targets


def run_ours(folder, inp, lora, out):
    u.run(MODEL, "forward", folder, inp, out, "--lora", lora)
    return st.load_file(out)["output"]


class Family:
    def __init__(self, kind, name, tmp):
        self.kind, self.name = kind, name
        self.cls = diffusers.WanTransformer3DModel if kind == "wan" else diffusers.CogVideoXTransformer3DModel
        self.pipe_cls = diffusers.WanPipeline if kind == "wan" else diffusers.CogVideoXPipeline
        self.folder = os.path.join(tmp, name)
        u.run(MODEL, "init", u.reference_dir("dit", name, "config.json"), self.folder, "--seed", "5")
        cfg = dict(self.fresh().config)
        g = torch.Generator().manual_seed(3)
        if kind == "wan":
            x = torch.randn(2, cfg["in_channels"], 3, 8, 12, generator=g)
            e = torch.randn(2, 7, cfg["text_dim"], generator=g)
        else:
            frames = 4 if cfg.get("patch_size_t") else 3
            x = torch.randn(2, frames, cfg["in_channels"], 8, 12, generator=g)
            e = torch.randn(2, cfg["max_text_seq_length"], cfg["text_embed_dim"], generator=g)
        self.t = {"hidden_states": x, "timestep": torch.tensor([700.0, 40.0]), "encoder_hidden_states": e}
        self.inp = os.path.join(tmp, name + "-in.safetensors")
        st.save_file(self.t, self.inp)

    def fresh(self):
        m = self.cls.from_pretrained(self.folder, torch_dtype=torch.float32)
        return m.eval()

    def pipe(self, model):
        if self.kind == "wan":
            return diffusers.WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=None, transformer=model)
        return diffusers.CogVideoXPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=None, transformer=model)

    @torch.no_grad()
    def forward(self, model):
        t = self.t
        if self.kind == "wan":
            return model(hidden_states=t["hidden_states"], timestep=t["timestep"],
                         encoder_hidden_states=t["encoder_hidden_states"], return_dict=False)[0]
        rot = None
        if model.config.use_rotary_positional_embeddings:
            x = t["hidden_states"]
            p = self.pipe(model)
            rot = p._prepare_rotary_positional_embeddings(x.shape[3] * p.vae_scale_factor_spatial,
                                                          x.shape[4] * p.vae_scale_factor_spatial, x.shape[1],
                                                          torch.device("cpu"))
        return model(hidden_states=t["hidden_states"], encoder_hidden_states=t["encoder_hidden_states"],
                     timestep=t["timestep"], image_rotary_emb=rot, return_dict=False)[0]


def check_load(fam, what, path, how, ours, base):
    model = fam.fresh()
    d, w = os.path.dirname(path), os.path.basename(path)
    try:
        if how == "pipeline":
            fam.pipe(model).load_lora_weights(d, weight_name=w)
        else:
            model.load_lora_adapter(d, weight_name=w, prefix="transformer")
    except Exception as e:  # a loader that fails is the finding: report it as a failed check
        u.check(False, f"{what}: {how} load raised {type(e).__name__}: {e}")
        return None
    y = fam.forward(model)
    u.check(u.rel(base, y) > 1e-3, f"{what}: the LoRA changes diffusers' output (rel {u.rel(base, y):.2g})")
    return u.close(y, ours, TOL, f"{what}: diffusers ({how}) vs videotrain-model forward --lora")


def main():
    tmp = u.tempdir()
    figures = []
    for kind, name, sets in [("wan", "wan_t2v_tiny", WAN_SETS), ("cogvideox", "cogvideox_2b_tiny", COG_SETS),
                             ("cogvideox", "cogvideox15_tiny", {"default": COG_SETS["default"]})]:
        fam = Family(kind, name, tmp.name)
        base = fam.forward(fam.fresh())
        for si, (label, pick) in enumerate(sets.items()):
            d = os.path.join(tmp.name, f"{name}-{si}")
            os.makedirs(d)
            src = os.path.join(d, "source.safetensors")
            targets = write_source(src, fam.fresh(), fam.pipe_cls, pick, seed=10 + si)
            tag = f"{name} [{label}, {len(targets)} modules]"
            namings = ["diffusers", "comfyui", "kohya"]
            for naming in namings:
                f = os.path.join(d, f"{naming}.safetensors")
                r = u.run(MODEL, "lora", "convert", src, f, "--format", naming, check=False)
                refused = kind == "cogvideox" and naming != "diffusers" or \
                    kind == "wan" and naming == "kohya" and label in ("head+embeddings", "head only")
                if refused:
                    want = "diffusers" if kind == "cogvideox" else "comfyui"
                    u.check(r.returncode != 0 and want in r.stderr and "naming" in r.stderr,
                            f"{tag}: lora convert to {naming} is refused naming {want}")
                    continue
                u.check(r.returncode == 0, f"{tag}: lora convert to {naming}")
                if r.returncode != 0:
                    continue
                ours = run_ours(fam.folder, fam.inp, f, os.path.join(d, f"out-{naming}.safetensors"))
                figures.append((f"{tag} {naming}, pipeline", check_load(fam, f"{tag} {naming}", f, "pipeline", ours, base)))
                if naming == "diffusers":
                    figures.append((f"{tag} {naming}, load_lora_adapter",
                                    check_load(fam, f"{tag} {naming}", f, "load_lora_adapter", ours, base)))
                if naming == "comfyui":
                    back = os.path.join(d, "comfyui-to-diffusers.safetensors")
                    u.run(MODEL, "lora", "convert", f, back, "--format", "diffusers")
                    ours2 = run_ours(fam.folder, fam.inp, back, os.path.join(d, "out-back.safetensors"))
                    figures.append((f"{tag} comfyui->diffusers, load_lora_adapter",
                                    check_load(fam, f"{tag} comfyui->diffusers", back, "load_lora_adapter", ours2, base)))
                if naming == "kohya" and label == "default":
                    keys = st.load_file(f)
                    u.check("lora_unet_blocks_1_ffn_2.lora_down.weight" in keys and
                            not keys["lora_unet_blocks_1_ffn_2.lora_up.weight"].any(),
                            f"{tag}: the kohya file holds the zero FFN adapters diffusers' musubi converter requires")
            if kind == "wan" and label == "default":
                # Without the model's sizes the FFN's zero adapters cannot be written: refused, naming comfyui.
                bare = os.path.join(d, "no-shapes.safetensors")
                tensors = st.load_file(src)
                with st.safe_open(src, "pt") as fh:
                    meta = {k: v for k, v in fh.metadata().items() if k != "videotrain.linear_shapes"}
                st.save_file(tensors, bare, metadata=meta)
                r = u.run(MODEL, "lora", "convert", bare, os.path.join(d, "x.safetensors"), "--format", "kohya",
                          check=False)
                u.check(r.returncode != 0 and "comfyui" in r.stderr and "ffn" in r.stderr,
                        f"{tag}: kohya without the model's sizes is refused, naming the module and comfyui")
    print("figures (rel L2, diffusers vs ours):")
    for what, r in figures:
        print(f"  {what}: {r if r is None else f'{r:.3g}'}")
    u.finish()


if __name__ == "__main__":
    main()
