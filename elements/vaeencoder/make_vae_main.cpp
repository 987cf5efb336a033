/* videotrain-make-vae OUTDIR [--seed N] [--tiny | --mid] [--dtype F32|F16|BF16]
 *
 * Writes a CogVideoX-architecture VAE folder (config.json + diffusion_pytorch_model.safetensors)
 * with seeded random encoder weights, for demos and tests without downloads. Default: the
 * CogVideoX-2b layout; --tiny: block_out_channels [16,32,32,32], 1 layer per block, 4 groups,
 * 4 latent channels; --mid: the benches' mid size, [64,128,128,256], 2 layers per block, 32 groups,
 * 16 latent channels (as vae-memory-bench --config mid). */
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "vae_config.h"

int main(int argc, char **argv) {
  std::string out, dtype = "F32";
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
    } else if (a == "-h" || a == "--help") {
      std::printf("usage: %s OUTDIR [--seed N] [--tiny | --mid] [--dtype F32|F16|BF16]\n", argv[0]);
      return 0;
    } else if (!a.empty() && a[0] != '-' && out.empty()) {
      out = a;
    } else {
      std::fprintf(stderr, "%s: unexpected argument '%s' (try --help)\n", argv[0], a.c_str());
      return 2;
    }
  }
  if (out.empty()) {
    std::fprintf(stderr, "usage: %s OUTDIR [--seed N] [--tiny | --mid] [--dtype F32|F16|BF16]\n", argv[0]);
    return 2;
  }
  if (tiny && mid) {
    std::fprintf(stderr, "%s: give --tiny or --mid, not both\n", argv[0]);
    return 2;
  }
  auto cfg = tiny  ? videotrain::vae::tiny_config()
             : mid ? videotrain::vae::mid_config()
                   : videotrain::vae::cogvideox_2b_config();
  std::string err;
  if (!videotrain::vae::make_random_vae(out, cfg, seed, dtype, &err)) {
    std::fprintf(stderr, "%s: %s\n", argv[0], err.c_str());
    return 1;
  }
  std::printf("%s: wrote %s/config.json and %s/diffusion_pytorch_model.safetensors\n", argv[0], out.c_str(),
              out.c_str());
  return 0;
}
