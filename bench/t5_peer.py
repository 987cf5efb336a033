#!/usr/bin/env python3
"""A plain PyTorch T5 v1.1 / umT5 encoder (T5EncoderModel's computation, written from its published
description), the peer of textencoder's native encoder.

    /usr/bin/python3 bench/t5_peer.py --check [REFERENCE_DIR]   # against tests/reference/text_encoder
    /usr/bin/python3 bench/t5_peer.py --write DIR [--layers 2] [--vocab 1024]   # that config as a bf16 sharded folder
    /usr/bin/python3 bench/t5_peer.py --bench [--folder DIR] [--length 512] [--batch 4] [--threads 2] [--repeat 3]

--check: hidden states with and without the mask against transformers' cases (1e-5 rel L2).
--bench: a real-width umT5-XXL config cut to a few layers (d_model 4096, 64 heads, d_kv 64, d_ff 10240,
vocab 1024), random weights, float32; prints captions per second at max-length 512 (the C++ bench compares).
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
    dt = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64}
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        b, e = v["data_offsets"]
        out[k] = torch.frombuffer(bytearray(data[b:e]), dtype=dt[v["dtype"]]).reshape(v["shape"])
    return out


def buckets(length, num_buckets, max_distance):
    pos = torch.arange(length)
    rel = pos[None, :] - pos[:, None]
    half = num_buckets // 2
    exact = half // 2
    ret = (rel > 0).long() * half
    n = rel.abs()
    large = exact + (torch.log(n.float() / exact) / math.log(max_distance / exact) * (half - exact)).long()
    large = large.clamp(max=half - 1)
    return ret + torch.where(n < exact, n, large)


def rms(x, w, eps):
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(w.dtype)


def encode(w, cfg, ids, mask=None):
    heads, dkv, eps = cfg["num_heads"], cfg["d_kv"], cfg["layer_norm_epsilon"]
    umt5 = cfg.get("model_type") == "umt5"
    b, length = ids.shape
    h = F.embedding(ids, w["shared.weight"])
    bk = buckets(length, cfg["relative_attention_num_buckets"], cfg["relative_attention_max_distance"])
    extra = 0.0 if mask is None else (1.0 - mask.float())[:, None, None, :] * torch.finfo(torch.float32).min
    bias = None
    for i in range(cfg["num_layers"]):
        p = f"encoder.block.{i}.layer."
        table = w.get(p + "0.SelfAttention.relative_attention_bias.weight")
        if table is not None:
            bias = F.embedding(bk, table).permute(2, 0, 1)[None].float() + extra
        x = rms(h, w[p + "0.layer_norm.weight"], eps)
        q, k, v = (F.linear(x, w[p + "0.SelfAttention." + n + ".weight"]).view(b, length, heads, dkv).transpose(1, 2)
                   for n in "qkv")
        att = torch.softmax((q @ k.transpose(-1, -2)).float() + bias, -1).to(v.dtype)
        h = h + F.linear((att @ v).transpose(1, 2).reshape(b, length, heads * dkv), w[p + "0.SelfAttention.o.weight"])
        x = rms(h, w[p + "1.layer_norm.weight"], eps)
        d = p + "1.DenseReluDense."
        g = F.gelu(F.linear(x, w[d + "wi_0.weight"]), approximate="tanh") * F.linear(x, w[d + "wi_1.weight"])
        h = h + F.linear(g, w[d + "wo.weight"])
        assert umt5 or i > 0 or table is not None
    return rms(h, w["encoder.final_layer_norm.weight"], eps)


def rel_l2(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def check(ref_dir):
    worst = 0.0
    for name, conv in (("t5_v11_tiny", "cogvideox"), ("umt5_tiny", "wan")):
        d = os.path.join(ref_dir, "text_encoder", name)
        cfg = json.load(open(os.path.join(d, "config.json")))
        w = read_safetensors(os.path.join(d, "model.safetensors"))
        cases = read_safetensors(os.path.join(d, "cases.safetensors"))
        ids, mask = cases["input_ids." + conv], cases["attention_mask." + conv]
        with torch.no_grad():
            e1 = rel_l2(encode(w, cfg, ids, mask), cases["last_hidden_state." + conv + ".masked"])
            e2 = rel_l2(encode(w, cfg, ids), cases["last_hidden_state." + conv + ".nomask"])
        print(f"{name}: masked {e1:.2g}, unmasked {e2:.2g}")
        worst = max(worst, e1, e2)
    return worst < 1e-5


def bench_config(layers, vocab):
    return {"model_type": "umt5", "num_heads": 64, "d_kv": 64, "d_model": 4096, "d_ff": 10240, "num_layers": layers,
            "vocab_size": vocab, "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128,
            "layer_norm_epsilon": 1e-6}


def bench_weights(cfg, seed=0):
    g = torch.Generator().manual_seed(seed)
    d, f, inner, s = cfg["d_model"], cfg["d_ff"], cfg["num_heads"] * cfg["d_kv"], 0.02
    w = {"shared.weight": torch.randn(cfg["vocab_size"], d, generator=g),
         "encoder.final_layer_norm.weight": torch.ones(d)}
    for i in range(cfg["num_layers"]):
        p = f"encoder.block.{i}.layer."
        for n in "qkv":
            w[p + "0.SelfAttention." + n + ".weight"] = torch.randn(inner, d, generator=g) * s
        w[p + "0.SelfAttention.o.weight"] = torch.randn(d, inner, generator=g) * s
        w[p + "0.SelfAttention.relative_attention_bias.weight"] = torch.randn(32, cfg["num_heads"], generator=g)
        w[p + "0.layer_norm.weight"] = torch.ones(d)
        w[p + "1.layer_norm.weight"] = torch.ones(d)
        w[p + "1.DenseReluDense.wi_0.weight"] = torch.randn(f, d, generator=g) * s
        w[p + "1.DenseReluDense.wi_1.weight"] = torch.randn(f, d, generator=g) * s
        w[p + "1.DenseReluDense.wo.weight"] = torch.randn(d, f, generator=g) * s
    return w


def write_folder(d, cfg, w, shard_bytes=256 << 20):
    """transformers' layout: config.json, model-0000N-of-0000M.safetensors in bf16, the index."""
    os.makedirs(d, exist_ok=True)
    conf = dict(cfg, architectures=["UMT5EncoderModel"], feed_forward_proj="gated-gelu", dense_act_fn="gelu_new",
                is_gated_act=True, torch_dtype="bfloat16")
    json.dump(conf, open(os.path.join(d, "config.json"), "w"), indent=2)
    shards, cur, size = [], [], 0
    for k in sorted(w):
        n = w[k].numel() * 2
        if cur and size + n > shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append(k)
        size += n
    shards.append(cur)
    weight_map, total = {}, 0
    for i, names in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
        for k in names:
            b = w[k].to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes()
            header[k] = {"dtype": "BF16", "shape": list(w[k].shape), "data_offsets": [off, off + len(b)]}
            blobs.append(b)
            off += len(b)
            weight_map[k] = fname
        hb = json.dumps(header).encode()
        hb += b" " * ((8 - len(hb) % 8) % 8)
        with open(os.path.join(d, fname), "wb") as f:
            f.write(struct.pack("<Q", len(hb)) + hb)
            for b in blobs:
                f.write(b)
        total += off
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map},
              open(os.path.join(d, "model.safetensors.index.json"), "w"), indent=2)


def read_folder(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    index = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    w = {}
    for f in sorted(set(index["weight_map"].values())):
        w.update({k: v.float() for k, v in read_safetensors(os.path.join(d, f)).items()})
    return cfg, w


def main():
    args = sys.argv[1:]
    if args and args[0] == "--check":
        ref = args[1] if len(args) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "reference")
        sys.exit(0 if check(ref) else 1)
    opts = {"--layers": 2, "--length": 512, "--batch": 4, "--threads": 2, "--repeat": 3, "--vocab": 1024}
    folder = None
    if "--folder" in args:
        folder = args[args.index("--folder") + 1]
        del args[args.index("--folder"):args.index("--folder") + 2]
    if args and args[0] == "--write":
        out = args[1]
        del args[:2]
        for key, value in zip(args[::2], args[1::2]):
            opts[key] = int(value)
        cfg = bench_config(opts["--layers"], opts["--vocab"])
        write_folder(out, cfg, bench_weights(cfg))
        return
    rest = [a for a in args if a != "--bench"]
    for key, value in zip(rest[::2], rest[1::2]):
        if key not in opts:
            sys.exit(f"t5_peer.py: unknown option {key}")
        opts[key] = int(value)
    torch.set_num_threads(opts["--threads"])
    if folder:
        cfg, w = read_folder(folder)
    else:
        cfg = bench_config(opts["--layers"], opts["--vocab"])
        w = bench_weights(cfg)
    ids = torch.randint(3, opts["--vocab"], (opts["--batch"], opts["--length"]), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[:, opts["--length"] // 2:] = 0
    with torch.no_grad():
        encode(w, cfg, ids, mask)  # warm-up
        best = float("inf")
        for _ in range(opts["--repeat"]):
            t = time.perf_counter()
            encode(w, cfg, ids, mask)
            best = min(best, time.perf_counter() - t)
    print(json.dumps({"captions_per_s": opts["--batch"] / best, "seconds": best}))


if __name__ == "__main__":
    main()
