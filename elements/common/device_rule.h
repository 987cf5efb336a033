/* One rule for the `device` property of every element (no torch: the caller passes how many
 * CUDA devices the process sees, so the rule is tested without a GPU).
 *
 *   "" or "auto"  cuda:(local_rank % count) when CUDA devices exist, else cpu: the ranks of a
 *                 node spread over its GPUs, and more ranks than GPUs share them round-robin
 *   "cpu"         cpu
 *   "cuda"        cuda:(local_rank % count)
 *   "cuda:N"      cuda:N, when N < count
 * Anything else, or CUDA asked for where there is none, is an error naming the property. */
#pragma once

#include <string>

namespace videotrain {

// The device name ("cpu" or "cuda:N") for `requested`; "" with *error set when it cannot be used.
std::string resolve_device(const std::string &requested, int local_rank, int cuda_devices, std::string *error);

}  // namespace videotrain
