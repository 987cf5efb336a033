/* One resolution of an engine's `device` and `dtype` properties: the device by resolve_device()
 * (device_rule.h) for the local rank and visible GPUs, the dtype by name (float32,
 * bfloat16 or float16; "" = bfloat16 on CUDA, float32 on CPU). Include only from torch
 * translation units. */
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <string>

#include "cuda_devices.h"
#include "device_rule.h"
#include "dist_env.h"
#include "tensor_buffer.h"

namespace videotrain {

struct DeviceDtype {
  c10::Device device = c10::Device(c10::kCPU);
  c10::ScalarType dtype = c10::kFloat;
};

// An engine's `device` property as a torch device, by resolve_device() for `local_rank` (the
// trainer's own; others take this process's LOCAL_RANK). False with *error naming the property.
inline bool resolve_torch_device(const std::string &device, int local_rank, c10::Device *out, std::string *error) {
  const std::string dev = resolve_device(device, local_rank, visible_cuda_devices(), error);
  if (dev.empty()) return false;
  *out = c10::Device(dev);
  return true;
}
inline bool resolve_torch_device(const std::string &device, c10::Device *out, std::string *error) {
  return resolve_torch_device(device, dist_env_from_environment().local_rank, out, error);
}

// False with *error naming the property when the device or the dtype cannot be used.
inline bool resolve_device_dtype(const std::string &device, const std::string &dtype, DeviceDtype *out,
                                 std::string *error) {
  if (!resolve_torch_device(device, &out->device, error)) return false;
  if (dtype.empty()) {
    out->dtype = out->device.is_cuda() ? c10::kBFloat16 : c10::kFloat;
    return true;
  }
  const auto d = dtype_from_name(dtype);
  if (!d) {
    *error = "dtype '" + dtype + "' is not float32, bfloat16 or float16";
    return false;
  }
  out->dtype = *d;
  return true;
}

}  // namespace videotrain
