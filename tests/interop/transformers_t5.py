#!/usr/bin/env python3
"""transformers' T5EncoderModel (T5 v1.1, gated-gelu) and UMT5EncoderModel against
`videotrain-model forward` on the folders transformers itself writes: tiny configs, seeded random
init with every parameter jittered, save_pretrained in float32; last_hidden_state for input_ids with padding in attention_mask
(and with no mask) within 1e-5 relative L2. `videotrain-model info` reports transformers'
parameter count and class. A perturbed copy of our output must fail the same comparison."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import interop_util as u  # noqa: E402

torch, transformers, st = u.need("torch", "transformers", "safetensors.torch")

TOL = 1e-5
tool = u.tool("videotrain-model")


def config(cls):
    # Few buckets and a short max distance so that L = 40 reaches the logarithmic buckets and the clamp.
    return cls(vocab_size=300, d_model=32, d_kv=8, d_ff=48, num_layers=3, num_heads=4,
               relative_attention_num_buckets=8, relative_attention_max_distance=20,
               feed_forward_proj="gated-gelu", dropout_rate=0.0, layer_norm_epsilon=1e-6)


def case(name, config_cls, model_cls, seed, tmp):
    torch.manual_seed(seed)
    model = model_cls(config(config_cls)).eval().float()
    with torch.no_grad():  # RMS-norm weights start at 1: jitter them (and the rest) so each one counts
        for p in model.parameters():
            p.mul_(1 + 0.1 * torch.randn(p.shape))
    folder = os.path.join(tmp, name)
    model.save_pretrained(folder)

    B, L = 3, 40
    g = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(2, 300, (B, L), generator=g)
    mask = torch.ones(B, L, dtype=torch.int64)
    for b, n in enumerate((L, 23, 5)):  # the first row full, the others padded
        mask[b, n:] = 0
        ids[b, n:] = 0  # the pad id, as a tokenizer pads
    with torch.no_grad():
        ref_masked = model(input_ids=ids, attention_mask=mask).last_hidden_state
        ref_plain = model(input_ids=ids).last_hidden_state

    info = u.run(tool, "info", folder)
    u.check(f"class: {model_cls.__name__}" in info.stdout, f"{name}: info names {model_cls.__name__}")
    u.check(f"parameters: {model.num_parameters()} " in info.stdout,
            f"{name}: info's parameter count is transformers' num_parameters() = {model.num_parameters()}")

    for what, feed, ref in (("padded mask", {"input_ids": ids, "attention_mask": mask}, ref_masked),
                            ("no mask", {"input_ids": ids}, ref_plain)):
        inp, out = os.path.join(tmp, f"{name}-in.safetensors"), os.path.join(tmp, f"{name}-out.safetensors")
        st.save_file({k: v.contiguous() for k, v in feed.items()}, inp)
        u.run(tool, "forward", folder, inp, out)
        ours = st.load_file(out)["last_hidden_state"]
        r = u.close(ref, ours, TOL, f"{name} ({what}): last_hidden_state [{B}, {L}, 32] vs transformers")
        print(f"FIGURE transformers {name} {what}: rel L2 {r:.3g}")
        noise = torch.randn(ours.shape, generator=g) * ours.norm() / ours.numel() ** 0.5
        u.check(u.rel(ref, ours + 1e-3 * noise) > TOL, f"{name} ({what}): a 1e-3 perturbation of ours fails the check")
    # The padding matters: the masked and unmasked references differ on the padded rows.
    u.check(u.rel(ref_plain, ref_masked) > 1e-2, f"{name}: the mask changes transformers' output")
    return folder, ids


tmp = u.tempdir()
t5, ids = case("t5_v11", transformers.T5Config, transformers.T5EncoderModel, 0, tmp.name)
case("umt5", transformers.UMT5Config, transformers.UMT5EncoderModel, 1, tmp.name)

# scripts/make_text_encoder.py --format t5|umt5: transformers loads the folder it writes (every tensor
# used: no missing or unexpected keys) and our forward of it equals transformers'.
captions = os.path.join(tmp.name, "captions.csv")
with open(captions, "w") as f:
    f.write("path,text\na.mp4,a red ball rolling on green grass\nb.mp4,a cat walking on a wall at night\n")
for fmt, model_cls in (("t5", transformers.T5EncoderModel), ("umt5", transformers.UMT5EncoderModel)):
    out = os.path.join(tmp.name, "made-" + fmt)
    u.run("/usr/bin/python3", os.path.join(u.source_dir(), "scripts", "make_text_encoder.py"), out,
          "--captions", captions, "--format", fmt, "--seed", "3")
    model, loading = model_cls.from_pretrained(os.path.join(out, "text_encoder"), output_loading_info=True)
    u.check(not loading["missing_keys"] and not loading["unexpected_keys"],
            f"made {fmt}: transformers loads every tensor ({loading})")
    vocab = model.config.vocab_size
    made_ids = torch.randint(2, vocab, (2, 12), generator=torch.Generator().manual_seed(5))
    made_mask = torch.ones(2, 12, dtype=torch.int64)
    made_mask[1, 7:] = 0
    with torch.no_grad():
        ref = model.eval()(input_ids=made_ids, attention_mask=made_mask).last_hidden_state
    inp, res = os.path.join(tmp.name, f"made-{fmt}-in.safetensors"), os.path.join(tmp.name, f"made-{fmt}-out.safetensors")
    st.save_file({"input_ids": made_ids, "attention_mask": made_mask}, inp)
    u.run(tool, "forward", os.path.join(out, "text_encoder"), inp, res)
    r = u.close(ref, st.load_file(res)["last_hidden_state"], TOL, f"made {fmt}: our forward vs transformers'")
    print(f"FIGURE transformers made-{fmt}: rel L2 {r:.3g}")

# Wrong input says what to give: a transformer's inputs into a text encoder, float ids.
bad = os.path.join(tmp.name, "bad.safetensors")
st.save_file({"hidden_states": torch.zeros(1, 4, 2, 4, 4)}, bad)
p = u.run(tool, "forward", t5, bad, os.path.join(tmp.name, "o.safetensors"), check=False)
u.check(p.returncode == 1 and "input_ids" in p.stderr and "attention_mask" in p.stderr,
        "a text encoder given a transformer's inputs names input_ids and attention_mask")
st.save_file({"input_ids": ids.float()}, bad)
p = u.run(tool, "forward", t5, bad, os.path.join(tmp.name, "o.safetensors"), check=False)
u.check(p.returncode == 1 and "integer token ids" in p.stderr, "float input_ids are refused")
st.save_file({"input_ids": ids + 1000}, bad)
p = u.run(tool, "forward", t5, bad, os.path.join(tmp.name, "o.safetensors"), check=False)
u.check(p.returncode == 1 and "vocabulary" in p.stderr, "ids past the vocabulary are refused")
u.finish()
