/* Torch's default generators are process-wide. The trainer draws a step's noise from them
 * (seeded per step), and a validation model without validation_step can only be made
 * repeatable by seeding them per sample. They take turns under default_rng_mutex(), and
 * validation puts the generators back as it found them, so the trainer's numbers do not
 * depend on whether or when validation ran. Include only from torch translation units. */
#pragma once

#include <ATen/Context.h>
#include <ATen/core/Generator.h>

#include <cstdint>
#include <mutex>
#include <vector>

namespace videotrain {

inline std::mutex &default_rng_mutex() {
  static std::mutex m;
  return m;
}

// Holds default_rng_mutex() and the states of the CPU generator and, for a CUDA device,
// that device's generator; restores them when it goes away.
class BorrowedDefaultRng {
 public:
  explicit BorrowedDefaultRng(c10::Device device) : lock_(default_rng_mutex()) {
    gens_.push_back(at::globalContext().defaultGenerator(c10::Device(c10::kCPU)));
    if (device.is_cuda()) gens_.push_back(at::globalContext().defaultGenerator(device));
    for (auto &g : gens_) {
      std::lock_guard<std::mutex> gl(g.mutex());
      states_.push_back(g.get_state());
    }
  }
  ~BorrowedDefaultRng() {
    for (size_t i = 0; i < gens_.size(); i++) {
      std::lock_guard<std::mutex> gl(gens_[i].mutex());
      gens_[i].set_state(states_[i]);
    }
  }
  BorrowedDefaultRng(const BorrowedDefaultRng &) = delete;
  BorrowedDefaultRng &operator=(const BorrowedDefaultRng &) = delete;

  void seed(uint64_t s) {
    for (auto &g : gens_) {
      std::lock_guard<std::mutex> gl(g.mutex());
      g.set_current_seed(s);
    }
  }

 private:
  std::lock_guard<std::mutex> lock_;
  std::vector<at::Generator> gens_;
  std::vector<at::Tensor> states_;
};

}  // namespace videotrain
