#include "microbatch_tensors.h"

#include <ATen/ATen.h>

#include <exception>
#include <memory>

#include "microbatcher_engine.h"
#include "tensor_buffer.h"

namespace videotrain {

struct HeldTensor {
  at::Tensor tensor;
  std::vector<std::pair<std::string, at::Tensor>> named;  // text_embeds, text_mask: stacked alike
};

HeldTensor *hold_tensor(GstBuffer *buf, const TensorCapsInfo &caps, std::string *why) {
  std::string reason;
  auto t = tensor_from_buffer(buf, &reason);
  if (!t) {
    if (why) *why = reason;
    return nullptr;
  }
  if (t->dim() != 4) {
    if (why) *why = "tensor has shape " + shape_string(t->sizes().vec()) + ", expected 4 dims [C, t, h, w]";
    return nullptr;
  }
  if (caps.dtype != dtype_name(t->scalar_type())) {
    if (why) *why = std::string("tensor dtype is ") + dtype_name(t->scalar_type()) + ", caps say " + caps.dtype;
    return nullptr;
  }
  auto held = std::make_unique<HeldTensor>();
  for (const std::string &name : tensor_names(buf)) {
    auto n = named_tensor_from_buffer(buf, name, &reason);
    if (!n) {
      if (why) *why = reason;
      return nullptr;
    }
    held->named.emplace_back(name, *n);
  }
  try {
    c10::Device dev(caps.device);
    if (t->device() != dev) *t = t->to(dev);
    for (auto &n : held->named)
      if (n.second.device() != dev) n.second = n.second.to(dev);
  } catch (const std::exception &e) {
    if (why) *why = "cannot put the tensor on device '" + caps.device + "': " + e.what();
    return nullptr;
  }
  held->tensor = *t;
  return held.release();
}

std::vector<int64_t> held_shape(const HeldTensor *t) { return t->tensor.sizes().vec(); }

void release_tensor(HeldTensor *t) { delete t; }

GstBuffer *stack_tensors(const std::vector<const HeldTensor *> &tensors, std::string *why) {
  if (tensors.empty()) {
    if (why) *why = "no tensors to stack";
    return nullptr;
  }
  try {
    std::vector<at::Tensor> list;
    list.reserve(tensors.size());
    for (const auto *h : tensors) list.push_back(h->tensor);
    GstBuffer *buf = buffer_from_tensor(at::stack(list, 0));
    const auto &first = tensors.front()->named;
    for (size_t k = 0; k < first.size(); k++) {
      std::vector<at::Tensor> parts;
      for (const auto *h : tensors) {
        if (h->named.size() != first.size() || h->named[k].first != first[k].first) {
          gst_buffer_unref(buf);
          if (why) *why = "samples of one micro-batch carry different tensors (" + first[k].first + ")";
          return nullptr;
        }
        parts.push_back(h->named[k].second);
      }
      buffer_append_tensor(buf, first[k].first, at::stack(parts, 0));
    }
    return buf;
  } catch (const std::exception &e) {
    if (why) *why = e.what();
    return nullptr;
  }
}

}  // namespace videotrain
