/* A sequence of tensors (one per temporal chunk of a clip) kept for a later pass: as they are
 * (on their device), in host memory, or appended to an unlinked temporary file so that resident
 * memory does not grow with the clip (the page cache holds what fits). Torch TUs only. */
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "models/vae/clip_scope_input.h"

namespace videotrain::vae {

class SpillStream {
 public:
  explicit SpillStream(SpillTo where);
  ~SpillStream();
  SpillStream(const SpillStream &) = delete;
  SpillStream &operator=(const SpillStream &) = delete;

  void push(const at::Tensor &t);
  size_t size() const { return entries_.size(); }
  // Chunk i, on `like`'s device and dtype.
  at::Tensor get(size_t i, const at::Tensor &like) const;

 private:
  struct Entry {
    at::Tensor held;  // in memory
    uint64_t offset = 0, bytes = 0;
    std::vector<int64_t> shape;
    c10::ScalarType dtype = c10::kFloat;
  };
  SpillTo where_;
  std::FILE *file_ = nullptr;
  uint64_t end_ = 0;
  std::vector<Entry> entries_;
};

}  // namespace videotrain::vae
