#include "microbatch_tensors.h"

#include <ATen/ATen.h>

#include <exception>

#include "microbatcher_engine.h"
#include "tensor_buffer.h"

namespace videotrain {

struct HeldTensor {
  at::Tensor tensor;
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
  try {
    c10::Device dev(caps.device);
    if (t->device() != dev) *t = t->to(dev);
  } catch (const std::exception &e) {
    if (why) *why = "cannot put the tensor on device '" + caps.device + "': " + e.what();
    return nullptr;
  }
  return new HeldTensor{*t};
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
    return buffer_from_tensor(at::stack(list, 0));
  } catch (const std::exception &e) {
    if (why) *why = e.what();
    return nullptr;
  }
}

}  // namespace videotrain
