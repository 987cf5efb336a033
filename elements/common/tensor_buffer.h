/* GstBuffers whose memory wraps an at::Tensor without copying.
 * Only translation units that already use torch include this. */
#pragma once

#include <ATen/core/Tensor.h>
#include <gst/gst.h>

#include <optional>
#include <string>

#include "latent_store.h"

namespace videotrain {

const char *dtype_name(c10::ScalarType t);                       // "float32", ...
std::optional<c10::ScalarType> dtype_from_name(const std::string &name);
std::string device_name(const c10::Device &d);                   // "cpu", "cuda:0"

// Wraps the tensor (made contiguous first) in a single GstMemory, and attaches the
// tensor meta (dtype, device, shape). CPU memory maps in place; CUDA memory maps
// read-only through a host copy made at map time.
GstBuffer *buffer_from_tensor(const at::Tensor &t);

// Appends a named tensor (text_embeds, text_mask) after the buffer's tensors: one more memory
// and a tensor meta with its name and byte offset. int64 tensors are named "int64" in the meta,
// uint8 ones "uint8".
void buffer_append_tensor(GstBuffer *buf, const std::string &name, const at::Tensor &t);
// Removes a named tensor (its bytes and its meta; later tensors' offsets move down) from a
// writable buffer. False when the buffer has no tensor of that name (or name is "").
bool buffer_remove_tensor(GstBuffer *buf, const std::string &name);

// The main tensor a buffer holds: the wrapped tensor itself when the memory is ours,
// else a CPU tensor rebuilt from the mapped bytes and the tensor meta.
std::optional<at::Tensor> tensor_from_buffer(GstBuffer *buf, std::string *why);
// A named tensor, the same way.
std::optional<at::Tensor> named_tensor_from_buffer(GstBuffer *buf, const std::string &name, std::string *why);
// A textencoder's text_embeds and text_mask, both or neither (left undefined). False with a reason
// when one cannot be read or only one is there.
bool text_tensors_from_buffer(GstBuffer *buf, at::Tensor *embeds, at::Tensor *mask, std::string *why);

bool is_tensor_memory(GstMemory *mem);

// A tensor as a latent cache entry holds it (contiguous CPU bytes), and back (CPU; null with a
// reason when the entry's dtype, shape and size do not agree).
CachedTensor cached_tensor_of(const std::string &name, const at::Tensor &t);
std::optional<at::Tensor> tensor_of_cached(const CachedTensor &c, std::string *why);

}  // namespace videotrain
