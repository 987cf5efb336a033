/* The first line of an error text: c10 errors append a long backtrace after it, which
 * element errors and bus messages should not carry. */
#pragma once

#include <string>
#include <vector>

namespace videotrain {

inline std::string first_line(std::string s) {
  if (auto nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
  return s;
}

namespace detail {

inline std::vector<std::string> split_lines(const std::string &s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t nl = s.find('\n', pos);
    if (nl == std::string::npos) nl = s.size();
    out.push_back(s.substr(pos, nl - pos));
    pos = nl + 1;
  }
  return out;
}

inline std::string trimmed(const std::string &s) {
  const size_t a = s.find_first_not_of(" \t\r");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t\r") + 1 - a);
}

// torch's own Python sources (torch.nn modules scripted with the model): the line a user
// wants is the last frame of their own file, not the one inside torch.
inline bool in_torch_package(const std::string &frame) {
  return frame.find("/torch/") != std::string::npos || frame.find("\"code/__torch__/torch/") != std::string::npos;
}

}  // namespace detail

inline constexpr const char *kTorchScriptFailed = "The following operation failed in the TorchScript interpreter";

// What went wrong, in one line, from an exception's what(). A TorchScript interpreter error
// opens with "The following operation failed in the TorchScript interpreter." and one or two
// tracebacks (serialized code, then the original code), each frame a 'File "...", line N, in
// f' line, the code, and a "~~~ <--- HERE" marker; it ends with the error itself (e.g.
// "RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x4 and 16x8)", which may span
// lines). That error comes first, then where: the innermost frame of the model's own source
// (of the original code when the file kept it) and the line it failed on. Other c10 errors
// open with the message and append a backtrace: their first line.
inline std::string error_message(const std::string &what) {
  if (what.rfind(kTorchScriptFailed, 0) != 0) return first_line(what);
  const auto lines = detail::split_lines(what);
  size_t last_marker = 0, original = 0;
  for (size_t i = 0; i < lines.size(); i++) {
    if (lines[i].find("<--- HERE") != std::string::npos) last_marker = i;
    if (lines[i].rfind("Traceback of TorchScript, original code", 0) == 0) original = i;
  }
  // The error: the lines after the last frame's code that are not indented (the frame's
  // code goes on, indented, after its marker).
  std::string error;
  bool started = false;
  for (size_t i = last_marker + 1; i < lines.size(); i++) {
    const std::string t = detail::trimmed(lines[i]);
    if (!started && (t.empty() || lines[i][0] == ' ')) continue;
    started = true;
    if (!t.empty()) error += (error.empty() ? "" : " ") + t;
  }
  if (error.empty()) error = detail::trimmed(lines.back().empty() && lines.size() > 1 ? lines[lines.size() - 2] : lines.back());
  // The frames of the traceback used: "File ..." and the code line before its marker.
  std::string where, code, any_where, any_code;
  std::string frame;
  for (size_t i = original; i <= last_marker && i < lines.size(); i++) {
    const std::string t = detail::trimmed(lines[i]);
    if (t.rfind("File \"", 0) == 0) frame = t;
    if (t.find("<--- HERE") != std::string::npos && i > 0 && !frame.empty()) {
      any_where = frame;
      any_code = detail::trimmed(lines[i - 1]);
      if (!detail::in_torch_package(frame)) {
        where = frame;
        code = any_code;
      }
    }
  }
  if (where.empty()) {
    where = any_where;
    code = any_code;
  }
  if (where.empty()) return error;
  return error + " (at " + where.substr(5) + ": " + code + ")";
}

}  // namespace videotrain
