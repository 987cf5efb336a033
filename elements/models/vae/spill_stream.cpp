#include "models/vae/spill_stream.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace videotrain::vae {

SpillStream::SpillStream(SpillTo where) : where_(where) {
  if (where != SpillTo::File) return;
  file_ = std::tmpfile();  // unlinked: nothing is left behind, whatever happens
  if (!file_) throw std::runtime_error(std::string("cannot create a spill file in TMPDIR: ") + std::strerror(errno));
}

SpillStream::~SpillStream() {
  if (file_) std::fclose(file_);
}

void SpillStream::push(const at::Tensor &t) {
  Entry e;
  e.shape = t.sizes().vec();
  e.dtype = t.scalar_type();
  if (!file_) {
    e.held = where_ == SpillTo::Host ? t.to(at::kCPU) : t;
    entries_.push_back(std::move(e));
    return;
  }
  at::Tensor c = t.to(at::kCPU).contiguous();
  e.bytes = static_cast<uint64_t>(c.numel()) * c.element_size();
  e.offset = end_;
  const char *p = static_cast<const char *>(c.data_ptr());
  for (uint64_t done = 0; done < e.bytes;) {
    ssize_t n = pwrite(fileno(file_), p + done, e.bytes - done, static_cast<off_t>(e.offset + done));
    if (n <= 0) throw std::runtime_error(std::string("cannot write the spill file: ") + std::strerror(errno));
    done += static_cast<uint64_t>(n);
  }
  end_ += e.bytes;
  entries_.push_back(std::move(e));
}

at::Tensor SpillStream::get(size_t i, const at::Tensor &like) const {
  const Entry &e = entries_.at(i);
  if (!file_) return e.held.to(like.device(), like.scalar_type());
  at::Tensor c = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
  char *p = static_cast<char *>(c.data_ptr());
  for (uint64_t done = 0; done < e.bytes;) {
    ssize_t n = pread(fileno(file_), p + done, e.bytes - done, static_cast<off_t>(e.offset + done));
    if (n <= 0) throw std::runtime_error(std::string("cannot read the spill file: ") + std::strerror(errno));
    done += static_cast<uint64_t>(n);
  }
  return c.to(like.device(), like.scalar_type());
}

}  // namespace videotrain::vae
