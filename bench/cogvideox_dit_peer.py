#!/usr/bin/env python3
"""A plain PyTorch CogVideoX transformer (CogVideoXTransformer3DModel's computation, functional, written
from its published description), the peer of ddptrainsink's native CogVideoX model in bench/cogvideox_bench.

    /usr/bin/python3 bench/cogvideox_dit_peer.py --check [REFERENCE_DIR]   # against tests/reference/dit cases
    /usr/bin/python3 bench/cogvideox_dit_peer.py --bench [--frames N] [--height N] [--width N] [--threads N] [--repeat N]

--check: forward output and every gradient against diffusers' cases for the 2b, 5b and 1.5 tiny folders
(1e-5 / 1e-4 rel L2; the rotary tables are the cases' own, as the pipeline hands them to the model).
--bench: a real-width 2-layer CogVideoX-2b config (30 heads x 64, time 512, text 4096, 226 text tokens),
random weights, one forward+backward; prints seconds per step (the C++ bench compares).
"""
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wan_peer import read_safetensors, rel  # noqa: E402


def lin(p, name, x):
    return F.linear(x, p[name + ".weight"], p.get(name + ".bias"))


def ln(p, name, x, eps):
    return F.layer_norm(x, (x.shape[-1],), p[name + ".weight"], p[name + ".bias"], eps)


def rope(x, cos, sin):  # x [B, H, S, D], pairs (2i, 2i+1)
    a, b = x.unflatten(-1, (-1, 2)).unbind(-1)
    return x * cos + torch.stack([-b, a], -1).flatten(-2) * sin


def sincos(dim, pos):
    omega = 1.0 / 10000 ** (torch.arange(dim // 2, dtype=torch.float64) / (dim / 2.0))
    a = torch.outer(pos.double().reshape(-1), omega)
    return torch.cat([a.sin(), a.cos()], 1)


def pos_table(cfg, f, h, w):
    dim = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    s = cfg["spatial_interpolation_scale"]
    gy, gx = torch.meshgrid(torch.arange(h, dtype=torch.float32) / s, torch.arange(w, dtype=torch.float32) / s,
                            indexing="ij")
    ds, dt = 3 * dim // 4, dim // 4
    spatial = torch.cat([sincos(ds // 2, gx), sincos(ds // 2, gy)], 1)
    temporal = sincos(dt, torch.arange(f, dtype=torch.float32) / cfg["temporal_interpolation_scale"])
    return torch.cat([temporal[:, None].expand(f, h * w, dt), spatial[None].expand(f, h * w, ds)], -1).reshape(-1, dim).float()


def forward(p, cfg, x, t, text, rotary=None):
    heads, hd = cfg["num_attention_heads"], cfg["attention_head_dim"]
    dim, eps, P, pt = heads * hd, cfg["norm_eps"], cfg["patch_size"], cfg["patch_size_t"] or 1
    B, Fr, C, H, W = x.shape
    f, h, w = Fr // pt, H // P, W // P
    half = dim // 2
    e = t.float()[:, None] * torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)[None]
    temb = lin(p, "time_embedding.linear_2", F.silu(lin(p, "time_embedding.linear_1", torch.cat([e.cos(), e.sin()], -1))))
    if cfg["patch_size_t"] is None:
        v = F.conv2d(x.reshape(B * Fr, C, H, W), p["patch_embed.proj.weight"], p.get("patch_embed.proj.bias"), stride=P)
        v = v.view(B, Fr, dim, h * w).transpose(2, 3).reshape(B, -1, dim)
    else:
        v = x.permute(0, 1, 3, 4, 2).reshape(B, f, pt, h, P, w, P, C).permute(0, 1, 3, 5, 7, 2, 4, 6).reshape(B, f * h * w, -1)
        v = lin(p, "patch_embed.proj", v)
    if not cfg["use_rotary_positional_embeddings"]:
        v = v + pos_table(cfg, f, h, w)
    L = text.shape[1]
    hs = torch.cat([lin(p, "patch_embed.text_proj", text), v], 1)
    for i in range(cfg["num_layers"]):
        b = "transformer_blocks.%d." % i

        def modulate(norm, hs):
            sh, sc, g, esh, esc, eg = lin(p, b + norm + ".linear", F.silu(temb))[:, None].chunk(6, -1)
            n = ln(p, b + norm + ".norm", hs, eps)
            n = torch.cat([n[:, :L] * (1 + esc) + esh, n[:, L:] * (1 + sc) + sh], 1)
            return n, torch.cat([eg.expand(-1, L, -1), g.expand(-1, hs.shape[1] - L, -1)], 1)
        n, g = modulate("norm1", hs)
        q, k, vv = (lin(p, b + "attn1." + m, n).unflatten(2, (heads, -1)).transpose(1, 2) for m in ("to_q", "to_k", "to_v"))
        q = F.layer_norm(q, (hd,), p[b + "attn1.norm_q.weight"], p[b + "attn1.norm_q.bias"], 1e-6)
        k = F.layer_norm(k, (hd,), p[b + "attn1.norm_k.weight"], p[b + "attn1.norm_k.bias"], 1e-6)
        if rotary is not None:
            q = torch.cat([q[:, :, :L], rope(q[:, :, L:], *rotary)], 2)
            k = torch.cat([k[:, :, :L], rope(k[:, :, L:], *rotary)], 2)
        if hasattr(F, "scaled_dot_product_attention"):
            o = F.scaled_dot_product_attention(q, k, vv)
        else:
            o = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd), -1) @ vv
        hs = hs + g * lin(p, b + "attn1.to_out.0", o.transpose(1, 2).flatten(2))
        n, g = modulate("norm2", hs)
        hs = hs + g * lin(p, b + "ff.net.2", F.gelu(lin(p, b + "ff.net.0.proj", n), approximate="tanh"))
    out = ln(p, "norm_final", hs[:, L:], eps)
    sh, sc = lin(p, "norm_out.linear", F.silu(temb))[:, None].chunk(2, -1)
    out = lin(p, "proj_out", ln(p, "norm_out.norm", out, eps) * (1 + sc) + sh)
    Co = cfg["out_channels"]
    if cfg["patch_size_t"] is None:
        return out.reshape(B, Fr, h, w, Co, P, P).permute(0, 1, 4, 2, 5, 3, 6).reshape(B, Fr, Co, H, W)
    return out.reshape(B, f, h, w, Co, pt, P, P).permute(0, 1, 5, 4, 2, 6, 3, 7).reshape(B, Fr, Co, H, W)


def check(ref):
    ok = True
    for name in ("cogvideox_2b_tiny", "cogvideox_5b_tiny", "cogvideox15_tiny"):
        d = os.path.join(ref, "dit", name)
        cfg = json.load(open(os.path.join(d, "config.json")))
        p, _ = read_safetensors(os.path.join(d, "diffusion_pytorch_model.safetensors"))
        cases, meta = read_safetensors(os.path.join(d, "cases.safetensors"))
        for c, info in json.loads(meta["cases"]).items():
            params = {k: v.clone().requires_grad_(True) for k, v in p.items()}
            x = cases["input.%s.hidden_states" % c].clone().requires_grad_(True)
            rot = (cases["input.%s.rotary_cos" % c], cases["input.%s.rotary_sin" % c]) \
                if "input.%s.rotary_cos" % c in cases else None
            out = forward(params, cfg, x, cases["input.%s.timestep" % c], cases["input.%s.encoder_hidden_states" % c], rot)
            (out * cases["cotangent." + c]).sum().backward()
            errs = {"output": rel(out.detach(), cases["output." + c]),
                    "grad hidden_states": rel(x.grad, cases["grad_input.%s.hidden_states" % c])}
            worst = max(errs.values())
            if info.get("parameter_gradients"):
                skip = lambda k: name == "cogvideox_2b_tiny" and k.endswith("attn1.norm_k.bias")  # zero (README)
                gp = max(rel(params[k].grad, cases["grad.%s.%s" % (c, k)]) for k in p if not skip(k))
                errs["worst parameter gradient"] = gp
                worst = max(worst, gp / 10)
            good = worst <= 1e-5
            ok &= good
            print("%s/%s: %s %s" % (name, c, ", ".join("%s %.2g" % kv for kv in errs.items()), "ok" if good else "FAIL"))
    return ok


def real_width(layers=2, heads=30, hd=64, time_dim=512, text=4096, cin=16):
    dim = heads * hd
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g) * 0.02
    p = {"patch_embed.proj.weight": r(dim, cin, 2, 2), "patch_embed.proj.bias": r(dim),
         "patch_embed.text_proj.weight": r(dim, text), "patch_embed.text_proj.bias": r(dim),
         "time_embedding.linear_1.weight": r(time_dim, dim), "time_embedding.linear_1.bias": r(time_dim),
         "time_embedding.linear_2.weight": r(time_dim, time_dim), "time_embedding.linear_2.bias": r(time_dim),
         "norm_final.weight": torch.ones(dim), "norm_final.bias": torch.zeros(dim),
         "norm_out.linear.weight": r(2 * dim, time_dim), "norm_out.linear.bias": r(2 * dim),
         "norm_out.norm.weight": torch.ones(dim), "norm_out.norm.bias": torch.zeros(dim),
         "proj_out.weight": r(4 * cin, dim), "proj_out.bias": r(4 * cin)}
    for i in range(layers):
        b = "transformer_blocks.%d." % i
        for n in ("norm1", "norm2"):
            p[b + n + ".linear.weight"], p[b + n + ".linear.bias"] = r(6 * dim, time_dim), r(6 * dim)
            p[b + n + ".norm.weight"], p[b + n + ".norm.bias"] = torch.ones(dim), torch.zeros(dim)
        for m in ("to_q", "to_k", "to_v", "to_out.0"):
            p[b + "attn1." + m + ".weight"], p[b + "attn1." + m + ".bias"] = r(dim, dim), r(dim)
        for m in ("norm_q", "norm_k"):
            p[b + "attn1." + m + ".weight"], p[b + "attn1." + m + ".bias"] = torch.ones(hd), torch.zeros(hd)
        p[b + "ff.net.0.proj.weight"], p[b + "ff.net.0.proj.bias"] = r(4 * dim, dim), r(4 * dim)
        p[b + "ff.net.2.weight"], p[b + "ff.net.2.bias"] = r(dim, 4 * dim), r(dim)
    cfg = {"num_attention_heads": heads, "attention_head_dim": hd, "norm_eps": 1e-5, "patch_size": 2, "patch_size_t": None,
           "use_rotary_positional_embeddings": False, "spatial_interpolation_scale": 1.875,
           "temporal_interpolation_scale": 1.0, "num_layers": layers, "out_channels": cin}
    return p, cfg


def bench(argv):
    opts = {"--frames": 3, "--height": 30, "--width": 44, "--threads": 0, "--repeat": 3}
    for i, a in enumerate(argv):
        if a in opts:
            opts[a] = int(argv[i + 1])
    if opts["--threads"]:
        torch.set_num_threads(opts["--threads"])
    p, cfg = real_width()
    p = {k: v.requires_grad_(True) for k, v in p.items()}
    x = torch.randn(1, opts["--frames"], 16, opts["--height"], opts["--width"])
    text = torch.randn(1, 226, 4096)
    t = torch.tensor([500])
    times = []
    for _ in range(opts["--repeat"] + 1):
        t0 = time.perf_counter()
        forward(p, cfg, x, t, text).square().mean().backward()
        times.append(time.perf_counter() - t0)
        for v in p.values():
            v.grad = None
    tokens = opts["--frames"] * (opts["--height"] // 2) * (opts["--width"] // 2)
    print(json.dumps({"peer": "plain PyTorch", "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "tokens": tokens, "seconds_per_step": min(times[1:])}))


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
