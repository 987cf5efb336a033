/* The torch side of microbatcher, kept out of the element face: holds the tensor of
 * each arriving latent buffer and stacks a micro-batch's tensors into one buffer. */
#pragma once

#include <gst/gst.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tensor_caps.h"

namespace videotrain {

struct HeldTensor;  // the latent tensor of one sample (opaque: no torch in this header)

// Takes the tensor out of a latent buffer and checks that it can be stacked: 4 dims
// [C, t, h, w] and the dtype of the negotiated caps. A tensor on another device than
// the caps say (a CPU copy made by an element in between) is moved to the caps device.
// nullptr with a reason when it cannot be used.
HeldTensor *hold_tensor(GstBuffer *buf, const TensorCapsInfo &caps, std::string *why);
std::vector<int64_t> held_shape(const HeldTensor *t);
void release_tensor(HeldTensor *t);

// Stacks [C, t, h, w] tensors of one shape into [m, C, t, h, w] on their device (no
// host round trip); the buffer wraps the result (with its tensor meta). nullptr with a
// reason on failure.
GstBuffer *stack_tensors(const std::vector<const HeldTensor *> &tensors, std::string *why);

}  // namespace videotrain
