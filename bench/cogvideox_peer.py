"""A plain-PyTorch CogVideoX VAE encoder: the Python peer of vaeencoder's native encoder in the benches.

Written from the architecture (diffusers' AutoencoderKLCogVideoX encoder, loaded from a diffusers folder:
config.json + diffusion_pytorch_model.safetensors), in the style of a Python encode: nn-free functional
calls under torch.inference_mode, causal convolutions padding time with their cache, GroupNorm over each
temporal chunk, and diffusers' chunking (chunk 0: frames [0, k + r), chunk i: [k*i + r, k*(i+1) + r),
r = T mod k). Run it with /usr/bin/python3 (Debian's torch).

    /usr/bin/python3 bench/cogvideox_peer.py --check [REFERENCE_DIR]   # against tiny_a/cases.safetensors
"""
import json
import os
import struct
import sys

import torch
import torch.nn.functional as F

_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}


def read_safetensors(path):
    """name -> tensor (a copy), and the metadata dict."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, e in header.items():
        a, b = e["data_offsets"]
        dt = _DTYPES[e["dtype"]]
        t = torch.frombuffer(bytearray(blob[base + a:base + b]), dtype=dt) if b > a else torch.empty(0, dtype=dt)
        out[name] = t.reshape(e["shape"])
    return out, meta


class CogVideoXPeer:
    def __init__(self, folder):
        with open(os.path.join(folder, "config.json")) as f:
            self.cfg = json.load(f)
        w, _ = read_safetensors(os.path.join(folder, "diffusion_pytorch_model.safetensors"))
        self.w = {k: v.float().contiguous() for k, v in w.items() if k.startswith(("encoder.", "quant_conv."))}
        self.groups = self.cfg["norm_num_groups"]
        self.eps = self.cfg.get("norm_eps", 1e-6)
        self.blocks = len(self.cfg["block_out_channels"])
        self.layers = self.cfg["layers_per_block"]
        self.time_levels = (self.cfg.get("temporal_compression_ratio", 4)).bit_length() - 1

    # One causal 3D convolution: time is padded on the left with the cache (or frame 0 repeated).
    def causal_conv(self, name, x, cache, new_cache):
        wt, b = self.w[name + ".weight"], self.w[name + ".bias"]
        kt, kh, kw = wt.shape[2:]
        if kt > 1:
            prev = cache.get(name) if cache is not None else None
            head = prev if prev is not None else x[:, :, :1].repeat(1, 1, kt - 1, 1, 1)
            x = torch.cat([head, x], dim=2)
            new_cache[name] = x[:, :, -(kt - 1):].clone()
        return F.conv3d(x, wt, b, padding=(0, kh // 2, kw // 2))

    def norm_act(self, name, x, eps):
        return F.silu(F.group_norm(x, self.groups, self.w[name + ".weight"], self.w[name + ".bias"], eps))

    def resnet(self, p, x, cache, new_cache):
        h = self.norm_act(p + ".norm1", x, self.eps)
        h = self.causal_conv(p + ".conv1.conv", h, cache, new_cache)
        h = self.norm_act(p + ".norm2", h, self.eps)
        h = self.causal_conv(p + ".conv2.conv", h, cache, new_cache)
        if p + ".conv_shortcut.weight" in self.w:
            x = F.conv3d(x, self.w[p + ".conv_shortcut.weight"], self.w[p + ".conv_shortcut.bias"])
        return x + h

    # Halve time (a lone first frame kept when the length is odd, then pairs averaged), then a
    # stride-2 3x3 conv per frame after one zero row and column at the bottom and right.
    def downsample(self, p, x, compress_time):
        B, C, T, H, W = x.shape
        if compress_time:
            seq = x.permute(0, 3, 4, 1, 2).reshape(B * H * W, C, T)
            if T % 2 == 1:
                first, rest = seq[..., :1], seq[..., 1:]
                seq = torch.cat([first, F.avg_pool1d(rest, 2, 2)], dim=-1) if T > 1 else first
            else:
                seq = F.avg_pool1d(seq, 2, 2)
            T = seq.shape[-1]
            x = seq.reshape(B, H, W, C, T).permute(0, 3, 4, 1, 2)
        frames = x.permute(0, 2, 1, 3, 4).reshape(B * T, C, H, W)
        frames = F.conv2d(F.pad(frames, (0, 1, 0, 1)), self.w[p + ".conv.weight"], self.w[p + ".conv.bias"], stride=2)
        return frames.reshape(B, T, C, frames.shape[-2], frames.shape[-1]).permute(0, 2, 1, 3, 4)

    def encoder(self, x, cache):
        new_cache = {}
        h = self.causal_conv("encoder.conv_in.conv", x, cache, new_cache)
        for i in range(self.blocks):
            p = "encoder.down_blocks.%d" % i
            for l in range(self.layers):
                h = self.resnet("%s.resnets.%d" % (p, l), h, cache, new_cache)
            if i != self.blocks - 1:
                h = self.downsample(p + ".downsamplers.0", h, i < self.time_levels)
        for l in range(2):
            h = self.resnet("encoder.mid_block.resnets.%d" % l, h, cache, new_cache)
        h = self.norm_act("encoder.norm_out", h, 1e-6)
        h = self.causal_conv("encoder.conv_out.conv", h, cache, new_cache)
        if "quant_conv.weight" in self.w:
            h = F.conv3d(h, self.w["quant_conv.weight"], self.w["quant_conv.bias"])
        return h, new_cache

    def encode(self, video, chunk_frames=8):
        """video [B, 3, T, H, W] in [-1, 1] -> moments [B, 2C, t, h, w] (mean and log-variance)."""
        with torch.inference_mode():
            T = video.shape[2]
            k, r = chunk_frames, T % chunk_frames
            cache, outs = None, []
            for i in range(max(T // k, 1)):
                s, e = (0 if i == 0 else k * i + r), k * (i + 1) + r
                h, cache = self.encoder(video[:, :, s:e], cache)
                outs.append(h)
            return torch.cat(outs, dim=2)


def check(ref_dir):
    peer = CogVideoXPeer(os.path.join(ref_dir, "cogvideox_vae", "tiny_a"))
    cases, meta = read_safetensors(os.path.join(ref_dir, "cogvideox_vae", "tiny_a", "cases.safetensors"))
    ok = True
    for T in (1, 9, 25):
        got = peer.encode(cases["input.T%d" % T])
        want = cases["chunked.T%d" % T]
        rel = float((got - want).norm() / want.norm()) if got.shape == want.shape else float("inf")
        ok = ok and rel <= 1e-5
        print("chunked.T%d: relative L2 %.3g %s" % (T, rel, "ok" if rel <= 1e-5 else "FAIL"))
    return ok


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--check":
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        ref = sys.argv[2] if len(sys.argv) > 2 else os.environ.get(
            "VIDEOTRAIN_REFERENCE_DIR", os.path.join(here, "tests", "reference"))
        sys.exit(0 if check(ref) else 1)
    print(__doc__)
