/* Whether an exception says that a device ran out of memory: LibTorch's OutOfMemoryError (CUDA),
 * its CPU allocator's "can't allocate memory", or std::bad_alloc. Elements that can retry with
 * less memory (smaller tiles) ask this; anything else stays an error. */
#pragma once

#include <c10/util/Exception.h>

#include <new>
#include <string>

namespace videotrain {

inline bool is_out_of_memory(const std::exception &e) {
  if (dynamic_cast<const std::bad_alloc *>(&e) || dynamic_cast<const c10::OutOfMemoryError *>(&e)) return true;
  const auto *c = dynamic_cast<const c10::Error *>(&e);
  const std::string msg = c ? c->msg() : e.what();
  return msg.find("out of memory") != std::string::npos || msg.find("can't allocate memory") != std::string::npos;
}

// The message without LibTorch's C++ backtrace, on one line.
inline std::string error_line(const std::exception &e) {
  const auto *c = dynamic_cast<const c10::Error *>(&e);
  std::string s = c ? c->what_without_backtrace() : e.what();
  if (const auto nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
  return s;
}

}  // namespace videotrain
