/* Helpers shared by the ddpvalsink tests: a deterministic validation set and a trainer
 * engine whose weights exist at start (so that at-start validates step 0). */
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "ddptrainsink/trainer_engine.h"
#include "ddpvalsink/validation_engine.h"

namespace valtest {

constexpr int64_t kC = 4;

inline at::Tensor latent(uint64_t id) {
  auto g = at::detail::createCPUGenerator(900 + id * 7);
  return at::randn({kC, 2, 8, 8}, g);
}

inline std::string caption(uint64_t id) { return id % 2 ? "a red car" : "waves on a beach"; }

inline videotrain::TrainerConfig trainer_config(const std::string &model = "builtin:tiny-unet3d") {
  videotrain::TrainerConfig c;
  c.model = model;
  c.latent_channels = kC;
  c.device = "cpu";
  c.seed = 11;
  c.backend = "gloo";
  c.log_every = 1;
  return c;
}

// A trainer on the test's stack as the shared_ptr that attach() takes (not owned).
inline std::shared_ptr<videotrain::TrainerEngine> borrowed(videotrain::TrainerEngine &t) {
  return std::shared_ptr<videotrain::TrainerEngine>(&t, [](videotrain::TrainerEngine *) {});
}

// The validation samples that one rank of `world` gets in `epoch`: ids rank, rank+world...
// of `total`, padded by wrapping (flagged) to ceil(total/world) clips.
inline std::vector<videotrain::ValSample> rank_samples(unsigned total, int rank, int world, unsigned epoch) {
  std::vector<videotrain::ValSample> out;
  const unsigned per = (total + world - 1) / world;
  for (unsigned k = 0; k < per; k++) {
    unsigned id = rank + k * world;
    videotrain::ValSample s;
    s.padding = id >= total;
    s.sample_id = s.padding ? id % total : id;
    s.epoch = epoch;
    s.clip_index = k;
    s.caption = caption(s.sample_id);
    out.push_back(s);
  }
  return out;
}

}  // namespace valtest
