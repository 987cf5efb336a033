#!/usr/bin/python3
"""A plain PyTorch VAE decoder (CogVideoX, Wan 2.1, Wan 2.2) written from diffusers' described
semantics, for vae_decode_bench: the peer the native decoder is timed against.

  vae_decode_peer.py check VAE_DIR            decode every case of VAE_DIR/decode_cases.safetensors
                                              and print the rel L2 against it (exit 1 above 1e-5)
  vae_decode_peer.py time VAE_DIR T H W REPS  time decoding a random normalised latent
                                              [C, T, H, W] (latent sizes), print "peer_ms <median>"
Needs Debian's python3-torch (/usr/bin/python3); reads no other package.
"""
import json
import struct
import sys
import time

import torch
import torch.nn.functional as F


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    dtypes = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[k] = torch.frombuffer(bytearray(data[a:b]), dtype=dtypes[v["dtype"]]).reshape(v["shape"]).float()
    return out, head.get("__metadata__", {})


def causal(x, w, b, cache, idx, first_repeat):
    """Causal conv, kernel kt in time: cache[idx] holds the last kt-1 input frames of the previous chunk;
    before the first chunk CogVideoX repeats the first frame, Wan pads zeros."""
    kt = w.shape[2]
    ph, pw = (w.shape[3] - 1) // 2, (w.shape[4] - 1) // 2
    if kt > 1:
        prev = cache.get(idx)
        if prev is None:
            prev = x[:, :, :1].expand(-1, -1, kt - 1, -1, -1) if first_repeat else torch.zeros_like(
                x[:, :, :1]).expand(-1, -1, kt - 1, -1, -1)
        x = torch.cat([prev, x], 2)
        cache[idx] = x[:, :, -(kt - 1):].clone()
    return F.conv3d(x, w, b, padding=(0, ph, pw))


class Cog:
    def __init__(self, d, cfg):
        self.w, self.cfg = d, cfg
        self.groups = cfg["norm_num_groups"]
        self.sf = cfg["scaling_factor"]
        self.levels = len(cfg["block_out_channels"])
        self.tlev = {1: 0, 2: 1, 4: 2, 8: 3}[int(cfg["temporal_compression_ratio"])]
        self.patch = 1
        self.s = 2 ** (self.levels - 1)
        self.clamp = False

    def denorm(self, z):
        return z / self.sf

    def chunks(self, t):
        r = t % 2
        n = max(t // 2, 1)
        return [(0 if k == 0 else 2 * k + r, 2 * (k + 1) + r) for k in range(n)]

    def conv(self, p, x, cache, idx):
        return causal(x, self.w[p + ".weight"], self.w[p + ".bias"], cache, idx, True)

    def snorm(self, p, f, zq):
        if f.shape[2] > 1 and f.shape[2] % 2 == 1:
            z = torch.cat([F.interpolate(zq[:, :, :1], size=(1,) + tuple(f.shape[-2:])),
                           F.interpolate(zq[:, :, 1:], size=(f.shape[2] - 1,) + tuple(f.shape[-2:]))], 2)
        else:
            z = F.interpolate(zq, size=tuple(f.shape[-3:]))
        y = F.conv3d(z, self.w[p + ".conv_y.conv.weight"], self.w[p + ".conv_y.conv.bias"])
        b = F.conv3d(z, self.w[p + ".conv_b.conv.weight"], self.w[p + ".conv_b.conv.bias"])
        n = F.group_norm(f, self.groups, self.w[p + ".norm_layer.weight"], self.w[p + ".norm_layer.bias"], 1e-6)
        return n * y + b

    def resnet(self, p, x, zq, cache):
        h = self.conv(p + ".conv1.conv", F.silu(self.snorm(p + ".norm1", x, zq)), cache, p + "1")
        h = self.conv(p + ".conv2.conv", F.silu(self.snorm(p + ".norm2", h, zq)), cache, p + "2")
        if p + ".conv_shortcut.weight" in self.w:
            x = F.conv3d(x, self.w[p + ".conv_shortcut.weight"], self.w[p + ".conv_shortcut.bias"])
        return h + x

    def up(self, p, x, compress_time):
        if compress_time and x.shape[2] > 1 and x.shape[2] % 2 == 1:
            x = torch.cat([F.interpolate(x[:, :, 0], scale_factor=2.0)[:, :, None],
                           F.interpolate(x[:, :, 1:], scale_factor=2.0)], 2)
        elif compress_time and x.shape[2] > 1:
            x = F.interpolate(x, scale_factor=2.0)
        else:
            b, c, t, h, w = x.shape
            x = F.interpolate(x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w), scale_factor=2.0)
            x = x.reshape(b, t, c, 2 * h, 2 * w).permute(0, 2, 1, 3, 4)
        b, c, t, h, w = x.shape
        y = F.conv2d(x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w), self.w[p + ".weight"], self.w[p + ".bias"],
                     padding=1)
        return y.reshape(b, t, -1, h, w).permute(0, 2, 1, 3, 4)

    def chunk(self, z, cache, first):
        x = self.conv("decoder.conv_in.conv", z, cache, "in")
        for r in range(2):
            x = self.resnet("decoder.mid_block.resnets.%d" % r, x, z, cache)
        for i in range(self.levels):
            p = "decoder.up_blocks.%d" % i
            r = 0
            while p + ".resnets.%d.conv1.conv.weight" % r in self.w:
                x = self.resnet(p + ".resnets.%d" % r, x, z, cache)
                r += 1
            if i != self.levels - 1:
                x = self.up(p + ".upsamplers.0.conv", x, i < self.tlev)
        x = F.silu(self.snorm("decoder.norm_out", x, z))
        return self.conv("decoder.conv_out.conv", x, cache, "out")


class Wan:
    def __init__(self, d, cfg):
        self.w, self.cfg = d, cfg
        self.z = cfg["z_dim"]
        self.mean = torch.tensor(cfg["latents_mean"]).view(1, -1, 1, 1, 1)
        self.std = torch.tensor(cfg["latents_std"]).view(1, -1, 1, 1, 1)
        self.patch = cfg.get("patch_size") or 1
        self.levels = len(cfg["dim_mult"])
        self.tup = list(reversed(cfg["temperal_downsample"]))
        self.res = cfg.get("is_residual", False)
        self.nres = cfg["num_res_blocks"]
        self.s = self.patch * 2 ** (self.levels - 1)
        self.clamp = True

    def denorm(self, z):
        return z * self.std + self.mean

    def chunks(self, t):
        return [(k, k + 1) for k in range(t)]

    def conv(self, p, x, cache, idx):
        return causal(x, self.w[p + ".weight"], self.w[p + ".bias"], cache, idx, False)

    def rms(self, p, x):
        return F.normalize(x, dim=1) * x.shape[1] ** 0.5 * self.w[p + ".gamma"]

    def resnet(self, p, x, cache):
        h = x
        if p + ".conv_shortcut.weight" in self.w:
            h = F.conv3d(x, self.w[p + ".conv_shortcut.weight"], self.w[p + ".conv_shortcut.bias"])
        y = self.conv(p + ".conv1", F.silu(self.rms(p + ".norm1", x)), cache, p + "1")
        y = self.conv(p + ".conv2", F.silu(self.rms(p + ".norm2", y)), cache, p + "2")
        return y + h

    def attn(self, p, x):
        b, c, t, h, w = x.shape
        y = self.rms(p + ".norm", x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w))
        qkv = F.conv2d(y, self.w[p + ".to_qkv.weight"], self.w[p + ".to_qkv.bias"])
        q, k, v = qkv.reshape(b * t, 3 * c, h * w).transpose(1, 2).chunk(3, -1)
        a = torch.softmax(q @ k.transpose(1, 2) / c ** 0.5, -1) @ v
        y = F.conv2d(a.transpose(1, 2).reshape(b * t, c, h, w), self.w[p + ".proj.weight"], self.w[p + ".proj.bias"])
        return y.view(b, t, c, h, w).permute(0, 2, 1, 3, 4) + x

    def upsample(self, p, x, time, cache):
        b, c, t, h, w = x.shape
        if time:
            if p not in cache:  # the first chunk keeps its single frame
                cache[p] = torch.zeros_like(x[:, :, :1]).expand(-1, -1, 2, -1, -1)
            else:
                x = self.conv(p + ".time_conv", x, cache, p)
                x = torch.stack([x[:, :c], x[:, c:]], 3).reshape(b, c, 2 * t, h, w)
        t = x.shape[2]
        y = x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w)
        y = F.interpolate(y, scale_factor=2.0, mode="nearest")
        y = F.conv2d(y, self.w[p + ".resample.1.weight"], self.w[p + ".resample.1.bias"], padding=1)
        return y.view(b, t, y.shape[1], 2 * h, 2 * w).permute(0, 2, 1, 3, 4)

    def dup_up(self, x, out_c, ft, first):
        b, c, t, h, w = x.shape
        x = x.repeat_interleave(out_c * ft * 4 // c, 1).view(b, out_c, ft, 2, 2, t, h, w)
        x = x.permute(0, 1, 5, 2, 6, 3, 7, 4).reshape(b, out_c, t * ft, h * 2, w * 2)
        return x[:, :, ft - 1:] if first else x

    def chunk(self, z, cache, first):
        z = F.conv3d(z, self.w["post_quant_conv.weight"], self.w["post_quant_conv.bias"])
        x = self.conv("decoder.conv_in", z, cache, "in")
        x = self.resnet("decoder.mid_block.resnets.0", x, cache)
        x = self.attn("decoder.mid_block.attentions.0", x)
        x = self.resnet("decoder.mid_block.resnets.1", x, cache)
        for i in range(self.levels):
            p = "decoder.up_blocks.%d" % i
            up = i != self.levels - 1
            time = up and self.tup[i]
            short = x
            for r in range(self.nres + 1):
                x = self.resnet(p + ".resnets.%d" % r, x, cache)
            if up:
                x = self.upsample(p + (".upsampler" if self.res else ".upsamplers.0"), x, time, cache)
            if self.res and up:
                x = x + self.dup_up(short, x.shape[1], 2 if time else 1, first)
        x = F.silu(self.rms("decoder.norm_out", x))
        return self.conv("decoder.conv_out", x, cache, "out")


def open_vae(folder):
    cfg = json.load(open(folder + "/config.json"))
    w, _ = load_safetensors(folder + "/diffusion_pytorch_model.safetensors")
    return (Wan if cfg["_class_name"] == "AutoencoderKLWan" else Cog)(w, cfg)


def unpatchify(x, p):
    if p == 1:
        return x
    b, c, t, h, w = x.shape
    x = x.view(b, c // (p * p), p, p, t, h, w).permute(0, 1, 4, 5, 3, 6, 2)
    return x.reshape(b, c // (p * p), t, h * p, w * p)


def blend(rows, bh, bw, sh, sw):
    out = []
    for i, row in enumerate(rows):
        res = []
        for j, tile in enumerate(row):
            if i > 0:
                a = rows[i - 1][j]
                n = min(a.shape[3], tile.shape[3], bh)
                for y in range(n):
                    tile[:, :, :, y] = a[:, :, :, -n + y] * (1 - y / n) + tile[:, :, :, y] * (y / n)
            if j > 0:
                a = row[j - 1]
                n = min(a.shape[4], tile.shape[4], bw)
                for x in range(n):
                    tile[:, :, :, :, x] = a[:, :, :, :, -n + x] * (1 - x / n) + tile[:, :, :, :, x] * (x / n)
            res.append(tile[:, :, :, :sh, :sw])
        out.append(torch.cat(res, 4))
    return torch.cat(out, 3)


def decode(vae, z, tile=None):
    """z: the decoder's input [1, C, T, h, w]; tile: (tile_h, tile_w, stride_h, stride_w) in pixels."""
    T, h, w = z.shape[2], z.shape[3], z.shape[4]
    s, p = vae.s, vae.patch

    def stream(zt):
        cache, outs = {}, []
        for k, (a, b) in enumerate(vae.chunks(T)):
            outs.append(vae.chunk(zt[:, :, a:b], cache, k == 0))
        return torch.cat(outs, 2)

    if tile and (w > tile[1] // s or h > tile[0] // s):
        th, tw, sh, sw = tile[0] // s, tile[1] // s, tile[2] // s, tile[3] // s
        rows = [[stream(z[:, :, :, i:i + th, j:j + tw]) for j in range(0, w, sw)] for i in range(0, h, sh)]
        out = blend(rows, (tile[0] - tile[2]) // p, (tile[1] - tile[3]) // p, tile[2] // p, tile[3] // p)
        out = out[:, :, :, :h * s // p, :w * s // p]
    else:
        out = stream(z)
    out = unpatchify(out, p)
    return out.clamp(-1, 1) if vae.clamp else out


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def check(folder):
    vae = open_vae(folder)
    cases, meta = load_safetensors(folder + "/decode_cases.safetensors")
    worst = 0.0
    with torch.no_grad():
        for key in sorted(k for k in cases if k.startswith("decoded.")):
            name = key[len("decoded."):]
            lat = cases["pipeline_latents." + name]
            if isinstance(vae, Cog):
                lat = lat.permute(0, 2, 1, 3, 4)
            e_in = rel(vae.denorm(lat), cases["vae_input." + name])
            e = rel(decode(vae, cases["vae_input." + name]), cases[key])
            print("%s %s: vae_input %.2e decoded %.2e" % (folder, name, e_in, e))
            worst = max(worst, e, e_in)
            if "tiled." + name in cases:
                t = json.loads(meta["tile"])
                if isinstance(vae, Cog):  # overlap factors -> strides in pixels
                    t = [t[0], t[1], int(t[0] - int(t[0] * t[2])), int(t[1] - int(t[1] * t[3]))]
                e = rel(decode(vae, cases["vae_input." + name], tuple(t)), cases["tiled." + name])
                print("%s %s tiled %s: %.2e" % (folder, name, t, e))
                worst = max(worst, e)
    return worst


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "check":
        sys.exit(0 if check(sys.argv[2]) <= 1e-5 else 1)
    if len(sys.argv) == 7 and sys.argv[1] == "time":
        torch.set_num_threads(max(1, torch.get_num_threads()))
        vae = open_vae(sys.argv[2])
        T, H, W, reps = (int(a) for a in sys.argv[3:7])
        c = vae.z if isinstance(vae, Wan) else vae.cfg["latent_channels"]
        z = torch.randn(1, c, T, H, W, generator=torch.Generator().manual_seed(0))
        times = []
        with torch.no_grad():
            for _ in range(reps):
                t0 = time.perf_counter()
                decode(vae, vae.denorm(z))
                times.append((time.perf_counter() - t0) * 1e3)
        print("peer_ms %.3f" % sorted(times)[len(times) // 2])
        return
    sys.exit(__doc__)


if __name__ == "__main__":
    main()
