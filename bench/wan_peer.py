#!/usr/bin/env python3
"""A plain PyTorch Wan 2.1/2.2 text-to-video transformer (WanTransformer3DModel's computation,
written from its published description), the peer of ddptrainsink's native Wan model.

    /usr/bin/python3 bench/wan_peer.py --check [REFERENCE_DIR]   # against tests/reference/dit cases
    /usr/bin/python3 bench/wan_peer.py --bench [--tokens N] [--threads N] [--repeat N]

--check: forward output and every gradient against diffusers' cases (1e-5 / 1e-4 rel L2).
--bench: a real-width 2-layer Wan 2.1 1.3B config (dim 1536, 12 heads, ffn 8960, text 4096),
random weights, one forward+backward; prints seconds per step (the C++ bench compares).
"""
import json
import math
import os
import struct
import sys
import time

import torch
import torch.nn.functional as F


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    dt = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64, "F64": torch.float64}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        b, e = v["data_offsets"]
        t = torch.frombuffer(bytearray(data[b:e]), dtype=dt[v["dtype"]]) if e > b else torch.empty(0, dtype=dt[v["dtype"]])
        out[k] = t.reshape(v["shape"])
    return out, header.get("__metadata__", {})


def rope_tables(head_dim, max_len):
    hw = 2 * (head_dim // 6)
    dims = [head_dim - 2 * hw, hw, hw]
    tabs = []
    for d in dims:
        freqs = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64)[: d // 2] / d))
        ang = torch.outer(torch.arange(max_len, dtype=torch.float64), freqs)
        tabs.append((ang.cos().repeat_interleave(2, 1).float(), ang.sin().repeat_interleave(2, 1).float()))
    return dims, tabs


def rope_for(dims, tabs, f, h, w):
    cos, sin = [], []
    for axis, (c, s) in enumerate(tabs):
        n = (f, h, w)[axis]
        shape = [1, 1, 1]
        shape[axis] = n
        cos.append(c[:n].view(*shape, -1).expand(f, h, w, -1))
        sin.append(s[:n].view(*shape, -1).expand(f, h, w, -1))
    return torch.cat(cos, -1).reshape(1, f * h * w, 1, -1), torch.cat(sin, -1).reshape(1, f * h * w, 1, -1)


def apply_rope(x, cos, sin):  # x [B, S, H, D]
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    c, s = cos[..., 0::2], sin[..., 1::2]
    return torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], -1).flatten(-2)


def rms(x, w, eps):
    return x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps) * w


def ln(x, eps, w=None, b=None):
    return F.layer_norm(x.float(), (x.shape[-1],), w, b, eps)


def linear(p, name, x):
    return F.linear(x, p[name + ".weight"], p.get(name + ".bias"))


def attention(p, pre, x, ctx, heads, eps, rope=None):
    q = rms(linear(p, pre + ".to_q", x), p[pre + ".norm_q.weight"], eps)
    k = rms(linear(p, pre + ".to_k", ctx), p[pre + ".norm_k.weight"], eps)
    v = linear(p, pre + ".to_v", ctx)
    q, k, v = (t.unflatten(2, (heads, -1)) for t in (q, k, v))
    if rope is not None:
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)) \
        if hasattr(F, "scaled_dot_product_attention") else \
        torch.softmax(q.transpose(1, 2) @ k.transpose(1, 2).transpose(-1, -2) / math.sqrt(q.shape[-1]), -1) @ v.transpose(1, 2)
    return linear(p, pre + ".to_out.0", o.transpose(1, 2).flatten(2))


def timestep_sinusoid(t, dim):
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
    a = t.float()[:, None] * freqs[None]
    return torch.cat([a.cos(), a.sin()], -1)


def forward(p, cfg, x, t, ctx, checkpoint=False):
    heads, hd = cfg["num_attention_heads"], cfg["attention_head_dim"]
    dim, eps = heads * hd, cfg["eps"]
    pt, ph, pw = cfg["patch_size"]
    B, C, T, H, W = x.shape
    f, h, w = T // pt, H // ph, W // pw
    dims, tabs = rope_tables(hd, cfg["rope_max_seq_len"])
    rope = rope_for(dims, tabs, f, h, w)
    hs = F.conv3d(x, p["patch_embedding.weight"], p["patch_embedding.bias"], stride=(pt, ph, pw)).flatten(2).transpose(1, 2)
    seq = None
    if t.dim() == 2:
        seq = t.shape[1]
        t = t.flatten()
    e = timestep_sinusoid(t, cfg["freq_dim"])
    if seq is not None:
        e = e.unflatten(0, (-1, seq))
    temb = linear(p, "condition_embedder.time_embedder.linear_2", F.silu(linear(p, "condition_embedder.time_embedder.linear_1", e)))
    tproj = linear(p, "condition_embedder.time_proj", F.silu(temb)).unflatten(-1, (6, -1))
    ctx = linear(p, "condition_embedder.text_embedder.linear_2",
                 F.gelu(linear(p, "condition_embedder.text_embedder.linear_1", ctx), approximate="tanh"))
    for i in range(cfg["num_layers"]):
        b = "blocks.%d" % i

        def block(hs, b=b):
            if tproj.dim() == 4:
                mods = [m.squeeze(2) for m in (p[b + ".scale_shift_table"].unsqueeze(0) + tproj.float()).chunk(6, 2)]
            else:
                mods = (p[b + ".scale_shift_table"] + tproj.float()).chunk(6, 1)
            sh, sc, g, csh, csc, cg = mods
            n = ln(hs, eps) * (1 + sc) + sh
            hs = hs + attention(p, b + ".attn1", n, n, heads, eps, rope) * g
            n = ln(hs, eps, p[b + ".norm2.weight"], p[b + ".norm2.bias"])
            hs = hs + attention(p, b + ".attn2", n, ctx, heads, eps)
            n = ln(hs, eps) * (1 + csc) + csh
            ff = linear(p, b + ".ffn.net.2", F.gelu(linear(p, b + ".ffn.net.0.proj", n), approximate="tanh"))
            return hs + ff * cg
        hs = torch.utils.checkpoint.checkpoint(block, hs) if checkpoint else block(hs)
    if temb.dim() == 3:
        sh, sc = [m.squeeze(2) for m in (p["scale_shift_table"].unsqueeze(0) + temb.unsqueeze(2)).chunk(2, 2)]
    else:
        sh, sc = (p["scale_shift_table"] + temb.unsqueeze(1)).chunk(2, 1)
    hs = ln(hs, eps) * (1 + sc) + sh
    hs = linear(p, "proj_out", hs)
    out = hs.reshape(B, f, h, w, pt, ph, pw, -1).permute(0, 7, 1, 4, 2, 5, 3, 6)
    return out.flatten(6, 7).flatten(4, 5).flatten(2, 3)


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def check(ref):
    ok = True
    for name in ("wan_t2v_tiny", "wan22_ti2v_tiny"):
        d = os.path.join(ref, "dit", name)
        cfg = json.load(open(os.path.join(d, "config.json")))
        p, _ = read_safetensors(os.path.join(d, "diffusion_pytorch_model.safetensors"))
        cases, meta = read_safetensors(os.path.join(d, "cases.safetensors"))
        for c, info in json.loads(meta["cases"]).items():
            params = {k: v.clone().requires_grad_(True) for k, v in p.items()}
            x = cases["input.%s.hidden_states" % c].clone().requires_grad_(True)
            ctx = cases["input.%s.encoder_hidden_states" % c].clone().requires_grad_(True)
            out = forward(params, cfg, x, cases["input.%s.timestep" % c], ctx)
            (out * cases["cotangent." + c]).sum().backward()
            errs = {"output": rel(out.detach(), cases["output." + c]),
                    "grad hidden_states": rel(x.grad, cases["grad_input.%s.hidden_states" % c])}
            worst = max(errs.values())
            if info.get("parameter_gradients"):
                errs["grad encoder_hidden_states"] = rel(ctx.grad, cases["grad_input.%s.encoder_hidden_states" % c])
                gp = max(rel(params[k].grad, cases["grad.%s.%s" % (c, k)]) for k in p)
                errs["worst parameter gradient"] = gp
                worst = max(worst, errs["grad encoder_hidden_states"], gp / 10)
            good = worst <= 1e-5
            ok &= good
            print("%s/%s: %s %s" % (name, c, ", ".join("%s %.2g" % kv for kv in errs.items()), "ok" if good else "FAIL"))
    return ok


def real_width_params(layers=2, dim=1536, heads=12, ffn=8960, text=4096, freq=256, cin=16):
    g = torch.Generator().manual_seed(0)
    r = lambda *s: (torch.randn(*s, generator=g) * 0.02)
    p = {"patch_embedding.weight": r(dim, cin, 1, 2, 2), "patch_embedding.bias": r(dim),
         "condition_embedder.time_embedder.linear_1.weight": r(dim, freq), "condition_embedder.time_embedder.linear_1.bias": r(dim),
         "condition_embedder.time_embedder.linear_2.weight": r(dim, dim), "condition_embedder.time_embedder.linear_2.bias": r(dim),
         "condition_embedder.time_proj.weight": r(6 * dim, dim), "condition_embedder.time_proj.bias": r(6 * dim),
         "condition_embedder.text_embedder.linear_1.weight": r(dim, text), "condition_embedder.text_embedder.linear_1.bias": r(dim),
         "condition_embedder.text_embedder.linear_2.weight": r(dim, dim), "condition_embedder.text_embedder.linear_2.bias": r(dim),
         "scale_shift_table": r(1, 2, dim), "proj_out.weight": r(cin * 4, dim), "proj_out.bias": r(cin * 4)}
    for i in range(layers):
        b = "blocks.%d." % i
        for a in ("attn1", "attn2"):
            for m in ("to_q", "to_k", "to_v", "to_out.0"):
                p[b + a + "." + m + ".weight"], p[b + a + "." + m + ".bias"] = r(dim, dim), r(dim)
            p[b + a + ".norm_q.weight"], p[b + a + ".norm_k.weight"] = torch.ones(dim), torch.ones(dim)
        p[b + "norm2.weight"], p[b + "norm2.bias"] = torch.ones(dim), torch.zeros(dim)
        p[b + "ffn.net.0.proj.weight"], p[b + "ffn.net.0.proj.bias"] = r(ffn, dim), r(ffn)
        p[b + "ffn.net.2.weight"], p[b + "ffn.net.2.bias"] = r(dim, ffn), r(dim)
        p[b + "scale_shift_table"] = r(1, 6, dim)
    cfg = {"num_attention_heads": heads, "attention_head_dim": dim // heads, "eps": 1e-6, "patch_size": [1, 2, 2],
           "rope_max_seq_len": 1024, "freq_dim": freq, "num_layers": layers}
    return p, cfg


def bench(argv):
    opts = {"--frames": 3, "--height": 30, "--width": 52, "--threads": 0, "--repeat": 3, "--text": 512}
    for i, a in enumerate(argv):
        if a in opts:
            opts[a] = int(argv[i + 1])
    if opts["--threads"]:
        torch.set_num_threads(opts["--threads"])
    p, cfg = real_width_params()
    p = {k: v.requires_grad_(True) for k, v in p.items()}
    x = torch.randn(1, 16, opts["--frames"], opts["--height"], opts["--width"])
    ctx = torch.randn(1, opts["--text"], 4096)
    t = torch.tensor([500.0])
    times = []
    for _ in range(opts["--repeat"] + 1):
        t0 = time.perf_counter()
        out = forward(p, cfg, x, t, ctx)
        out.square().mean().backward()
        times.append(time.perf_counter() - t0)
        for v in p.values():
            v.grad = None
    tokens = opts["--frames"] * (opts["--height"] // 2) * (opts["--width"] // 2)
    best = min(times[1:])
    print(json.dumps({"peer": "plain PyTorch", "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "tokens": tokens, "seconds_per_step": best}))


if __name__ == "__main__":
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if len(sys.argv) >= 2 and sys.argv[1] == "--check":
        ref = sys.argv[2] if len(sys.argv) > 2 else os.environ.get(
            "VIDEOTRAIN_REFERENCE_DIR", os.path.join(here, "tests", "reference"))
        sys.exit(0 if check(ref) else 1)
    if len(sys.argv) >= 2 and sys.argv[1] == "--bench":
        bench(sys.argv[2:])
        sys.exit(0)
    print(__doc__)
