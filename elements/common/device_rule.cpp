/* See device_rule.h. */
#include "device_rule.h"

#include <cctype>

namespace videotrain {

namespace {

constexpr const char *kHint = " (property device: auto, cpu, cuda or cuda:N)";

std::string failed(std::string *error, const std::string &text) {
  if (error) *error = text;
  return "";
}

}  // namespace

std::string resolve_device(const std::string &requested, int local_rank, int cuda_devices, std::string *error) {
  const int count = cuda_devices > 0 ? cuda_devices : 0;
  const int slot = local_rank > 0 ? local_rank : 0;
  if (requested.empty() || requested == "auto") return count > 0 ? "cuda:" + std::to_string(slot % count) : "cpu";
  if (requested == "cpu") return "cpu";
  const std::string quoted = "device '" + requested + "'";
  const std::string not_a_name = quoted + " is not a device name" + kHint;
  if (requested.compare(0, 4, "cuda") != 0) return failed(error, not_a_name);
  int index = -1;  // plain "cuda"
  if (requested.size() > 4) {
    const std::string digits = requested.substr(5);
    if (requested[4] != ':' || digits.empty() || digits.size() > 4) return failed(error, not_a_name);
    index = 0;
    for (char ch : digits) {
      if (!std::isdigit(static_cast<unsigned char>(ch))) return failed(error, not_a_name);
      index = index * 10 + (ch - '0');
    }
  }
  if (count == 0) return failed(error, quoted + " asks for CUDA, but this LibTorch sees no CUDA device" + kHint);
  if (index < 0) return "cuda:" + std::to_string(slot % count);
  if (index >= count)
    return failed(error, quoted + ": this process sees " + std::to_string(count) + " CUDA device(s), cuda:0 .. cuda:" +
                             std::to_string(count - 1) + " (CUDA_VISIBLE_DEVICES may hide the others)" + kHint);
  return "cuda:" + std::to_string(index);
}

}  // namespace videotrain
