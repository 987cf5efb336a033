/* videotrain-make-vae OUTDIR [--family cogvideox|wan21|wan22] [--seed N] [--tiny | --mid] [--dtype F32|F16|BF16]
 *
 * Writes a diffusers VAE folder (config.json + diffusion_pytorch_model.safetensors) with seeded
 * random encoder and decoder weights (vaeencoder and vaedecoder take it), for demos and tests
 * without downloads.
 *
 * --family cogvideox (default): AutoencoderKLCogVideoX. Default: the CogVideoX-2b layout;
 *   --tiny: block_out_channels [16,32,32,32], 1 layer per block, 4 groups, 4 latent channels;
 *   --mid: the benches' mid size, [64,128,128,256], 2 layers per block, 32 groups, 16 latent
 *   channels (as vae-memory-bench --config mid).
 * --family wan21: AutoencoderKLWan (Wan 2.1). Default: Wan 2.1's layout (base_dim 96, 16 latent
 *   channels); --tiny: base_dim 16, dim_mult [1,2,2,2], 1 resnet per level, 4 latent channels
 *   (8x spatial, 4x temporal compression, like Wan 2.1).
 * --family wan22: AutoencoderKLWan (Wan 2.2, TI2V-5B's): base_dim 160 (decoder 256), 48 latent
 *   channels, residual blocks, 2x2 pixel patches (16x spatial); --tiny: that layout at base_dim 16,
 *   8 latent channels. */
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "vae_config.h"
#include "wan_config.h"

namespace {

const char *kUsage = "usage: %s OUTDIR [--family cogvideox|wan21|wan22] [--seed N] [--tiny | --mid] [--dtype F32|F16|BF16]\n";

}  // namespace

int main(int argc, char **argv) {
  std::string out, dtype = "F32", family = "cogvideox";
  unsigned long long seed = 0;
  bool tiny = false, mid = false;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    if (a == "--tiny") {
      tiny = true;
    } else if (a == "--mid") {
      mid = true;
    } else if (a == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--dtype" && i + 1 < argc) {
      dtype = argv[++i];
    } else if (a == "--family" && i + 1 < argc) {
      family = argv[++i];
    } else if (a == "-h" || a == "--help") {
      std::printf(kUsage, argv[0]);
      return 0;
    } else if (!a.empty() && a[0] != '-' && out.empty()) {
      out = a;
    } else {
      std::fprintf(stderr, "%s: unexpected argument '%s' (try --help)\n", argv[0], a.c_str());
      return 2;
    }
  }
  if (out.empty()) {
    std::fprintf(stderr, kUsage, argv[0]);
    return 2;
  }
  if (tiny && mid) {
    std::fprintf(stderr, "%s: give --tiny or --mid, not both\n", argv[0]);
    return 2;
  }
  if (family != "cogvideox" && family != "wan21" && family != "wan22") {
    std::fprintf(stderr, "%s: --family is cogvideox, wan21 or wan22, not '%s'\n", argv[0], family.c_str());
    return 2;
  }
  if (family != "cogvideox" && mid) {
    std::fprintf(stderr, "%s: --mid is a CogVideoX size; --family %s takes --tiny or nothing\n", argv[0], family.c_str());
    return 2;
  }
  std::string err;
  bool ok;
  if (family == "wan21" || family == "wan22") {
    const auto cfg = family == "wan21" ? (tiny ? videotrain::vae::tiny_wan21_config() : videotrain::vae::wan21_config())
                                       : (tiny ? videotrain::vae::tiny_wan22_config() : videotrain::vae::wan22_config());
    ok = videotrain::vae::make_random_wan_vae(out, cfg, seed, dtype, &err);
  } else {
    const auto cfg = tiny  ? videotrain::vae::tiny_config()
                     : mid ? videotrain::vae::mid_config()
                           : videotrain::vae::cogvideox_2b_config();
    ok = videotrain::vae::make_random_vae(out, cfg, seed, dtype, &err);
  }
  if (!ok) {
    std::fprintf(stderr, "%s: %s\n", argv[0], err.c_str());
    return 1;
  }
  std::printf("%s: wrote %s/config.json and %s/diffusion_pytorch_model.safetensors\n", argv[0], out.c_str(),
              out.c_str());
  return 0;
}
