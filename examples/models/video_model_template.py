#!/usr/bin/python3
"""A template for your own video model, saved as a TorchScript file that ddptrainsink and
ddpvalsink load (`ddptrainsink model=my_model.pt`, `ddpvalsink trainer=...` uses the same file).

The contract (both methods exported with @torch.jit.export):
  training_step(latents: Tensor[m, C, t, h, w], captions: List[str]) -> Tensor (scalar loss)
      ddptrainsink calls it once per micro-batch, under a generator it reseeds from
      seed, rank and step (so torch.randn/rand here are reproducible and resume exactly),
      then runs backward and the all-reduce itself.
  validation_step(latents, captions, seeds: Tensor[m] int64) -> Tensor[m] (per-sample loss)
      ddpvalsink calls it in eval mode without gradients; `seeds` is fixed per sample, so the
      same sample gets the same noise at every pass and losses are comparable across steps.
      Without it, ddpvalsink falls back to training_step under a per-sample seeded generator.

What is here: a small rectified-flow denoiser (3D convolutions) conditioned on a hashed
caption embedding and the noise level. Replace `VideoModel.denoise` and `caption_ids` with
your network and text conditioning; keep the two methods' signatures.

    /usr/bin/python3 examples/models/video_model_template.py my_model.pt --latent-channels 16
"""
import argparse
from typing import List

import torch
from torch import nn
from torch.nn import functional as F


class VideoModel(nn.Module):
    def __init__(self, latent_channels: int, width: int = 32, caption_buckets: int = 1024):
        super().__init__()
        self.caption_buckets = caption_buckets
        self.caption = nn.Embedding(caption_buckets, width)
        self.noise_level = nn.Linear(1, width)
        self.inp = nn.Conv3d(latent_channels, width, 3, padding=1)
        self.mid = nn.Conv3d(width, width, 3, padding=1)
        self.out = nn.Conv3d(width, latent_channels, 3, padding=1)

    def caption_ids(self, captions: List[str]) -> torch.Tensor:
        # Stand-in text conditioning: a stable hash of each caption into an embedding table.
        ids: List[int] = []
        for c in captions:
            h = 0
            for ch in c:
                h = (h * 31 + ord(ch)) % self.caption_buckets
            ids.append(h)
        return torch.tensor(ids, dtype=torch.long)

    def denoise(self, x_t: torch.Tensor, t: torch.Tensor, captions: List[str]) -> torch.Tensor:
        cond = self.caption(self.caption_ids(captions).to(x_t.device)) + self.noise_level(t[:, None])
        h = F.silu(self.inp(x_t) + cond[:, :, None, None, None])
        h = F.silu(self.mid(h))
        return self.out(h)

    def flow_losses(self, latents: torch.Tensor, noise: torch.Tensor, t: torch.Tensor,
                    captions: List[str]) -> torch.Tensor:
        # Rectified flow: x_t = (1 - t) x + t noise; the network predicts the velocity noise - x.
        t5 = t.view(-1, 1, 1, 1, 1)
        x_t = (1 - t5) * latents + t5 * noise
        pred = self.denoise(x_t, t, captions)
        return ((pred - (noise - latents)) ** 2).flatten(1).mean(1)

    @torch.jit.export
    def training_step(self, latents: torch.Tensor, captions: List[str]) -> torch.Tensor:
        noise = torch.randn_like(latents)
        t = torch.rand(latents.size(0), device=latents.device, dtype=latents.dtype)
        return self.flow_losses(latents, noise, t, captions).mean()

    @torch.jit.export
    def validation_step(self, latents: torch.Tensor, captions: List[str], seeds: torch.Tensor) -> torch.Tensor:
        # Noise and noise level fixed by each sample's seed (a counter-based hash, as TorchScript
        # has no per-call generator), so every pass scores the same problem.
        m = latents.size(0)
        n = latents[0].numel()
        idx = torch.arange(n, device=latents.device, dtype=torch.float64)
        noises: List[torch.Tensor] = []
        levels: List[float] = []
        for i in range(m):
            s = float(int(seeds[i].item()) % 1000003)
            u1 = torch.frac(torch.sin(idx * 12.9898 + s * 78.233) * 43758.5453).clamp(1e-7, 1.0)
            u2 = torch.frac(torch.sin(idx * 39.3468 + s * 11.135) * 24634.6345)
            noises.append((torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(6.283185307179586 * u2)).view(latents[0].shape))
            levels.append(0.1 + 0.8 * ((s * 0.6180339887) % 1.0))
        noise = torch.stack(noises).to(latents.dtype)
        t = torch.tensor(levels, device=latents.device, dtype=latents.dtype)
        return self.flow_losses(latents, noise, t, captions)

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        return self.denoise(latents, torch.zeros(latents.size(0), dtype=latents.dtype, device=latents.device), [""] * latents.size(0))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("output", help="TorchScript file to write (model=... of ddptrainsink)")
    ap.add_argument("--latent-channels", type=int, default=16,
                    help="C of the latents (16 for CogVideoX's VAE; vaeencoder latent=moments doubles it)")
    ap.add_argument("--width", type=int, default=32, help="hidden channels")
    ap.add_argument("--seed", type=int, default=0, help="initial weights (every rank gets rank 0's anyway)")
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    torch.jit.script(VideoModel(a.latent_channels, a.width)).save(a.output)
    print(f"wrote {a.output}")


if __name__ == "__main__":
    main()
