/* The first line of an error text: c10 errors append a long backtrace after it, which
 * element errors and bus messages should not carry. */
#pragma once

#include <string>

namespace videotrain {

inline std::string first_line(std::string s) {
  if (auto nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
  return s;
}

}  // namespace videotrain
