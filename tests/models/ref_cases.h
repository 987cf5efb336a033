// Reference cases (tests/reference, safetensors written by diffusers' own code) as tensors.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>

#include "safetensors.h"
#include "test_util.h"

namespace modeltest {

class RefFile {
 public:
  explicit RefFile(const std::string &relative) { open(vttest::reference_dir() + "/" + relative); }
  enum Absolute { kAbsolute };
  RefFile(const std::string &path, Absolute) { open(path); }
  bool ok() const { return file_ != nullptr; }
  bool has(const std::string &key) const { return file_ && file_->find(key); }
  at::Tensor get(const std::string &key) const {
    const auto *e = file_ ? file_->find(key) : nullptr;
    if (!e) {
      ADD_FAILURE() << "no tensor " << key;
      return at::Tensor();
    }
    const auto dt = e->dtype == "F32" ? at::kFloat : e->dtype == "I64" ? at::kLong : e->dtype == "F64" ? at::kDouble : at::kByte;
    at::Tensor t = at::empty(e->shape, dt);
    std::memcpy(t.data_ptr(), e->data, e->nbytes);
    return t;
  }
  std::string meta(const std::string &k) const { return file_->metadata().at(k); }

 private:
  void open(const std::string &path) {
    std::string err;
    file_ = videotrain::SafetensorsFile::open(path, &err);
    if (!file_) ADD_FAILURE() << err;
  }
  std::unique_ptr<videotrain::SafetensorsFile> file_;
};

// ||a - b|| / ||b|| over the whole tensor (the reference README's "rel L2").
inline double rel_l2(const at::Tensor &a, const at::Tensor &b) {
  const auto bf = b.to(at::kDouble), af = a.to(at::kDouble);
  return (af - bf).norm().item<double>() / std::max(bf.norm().item<double>(), 1e-30);
}

}  // namespace modeltest
