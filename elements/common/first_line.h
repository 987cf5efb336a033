/* The first line of an error text: c10 errors append a long backtrace after it, which
 * element errors and bus messages should not carry. */
#pragma once

#include <string>

namespace videotrain {

inline std::string first_line(std::string s) {
  if (auto nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
  return s;
}

// What went wrong, in one line, from an exception's what(): a TorchScript interpreter error
// opens with "The following operation failed in the TorchScript interpreter." and two
// tracebacks, and ends with the error itself (e.g. "builtins.RuntimeError: <the model's
// message>"); other c10 errors open with the message and append a backtrace.
inline std::string error_message(const std::string &what) {
  if (what.rfind("The following operation failed in the TorchScript interpreter", 0) != 0) return first_line(what);
  size_t end = what.find_last_not_of(" \t\r\n");
  if (end == std::string::npos) return what;
  size_t start = what.find_last_of('\n', end);
  start = start == std::string::npos ? 0 : start + 1;
  return what.substr(start, end + 1 - start);
}

}  // namespace videotrain
