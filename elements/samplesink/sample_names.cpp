#include "sample_names.h"

#include <cctype>
#include <vector>

namespace videotrain {
namespace {

// Walks the pattern: literal text to `out`, each conversion's width to `widths`. False at a bad '%'.
bool walk(const std::string &p, std::string *literal_out, std::vector<int> *widths, std::vector<size_t> *at,
          std::string *why) {
  for (size_t i = 0; i < p.size(); i++) {
    if (p[i] != '%') {
      if (literal_out) *literal_out += p[i];
      continue;
    }
    if (i + 1 < p.size() && p[i + 1] == '%') {
      if (literal_out) *literal_out += '%';
      i++;
      continue;
    }
    size_t j = i + 1;
    int width = 0;
    while (j < p.size() && std::isdigit(static_cast<unsigned char>(p[j])) && width < 100) width = width * 10 + (p[j++] - '0');
    if (j >= p.size() || p[j] != 'd' || width > 20) {
      if (why) *why = "'" + p.substr(i, j - i + 1) + "' at byte " + std::to_string(i) + " is not %d or %0Nd (N <= 20)";
      return false;
    }
    widths->push_back(width);
    if (at) at->push_back(literal_out ? literal_out->size() : 0);
    i = j;
  }
  return true;
}

std::string padded(uint64_t v, int width) {
  std::string s = std::to_string(v);
  if (int(s.size()) < width) s.insert(0, size_t(width) - s.size(), '0');
  return s;
}

}  // namespace

std::string check_sample_pattern(const std::string &pattern) {
  std::vector<int> widths;
  std::string why;
  if (pattern.empty()) return "is empty";
  if (!walk(pattern, nullptr, &widths, nullptr, &why)) return why;
  if (widths.size() != 2)
    return "has " + std::to_string(widths.size()) + " %d conversions; it needs two: the step, then the prompt index";
  return "";
}

std::string sample_file_name(const std::string &pattern, uint64_t step, uint32_t prompt) {
  std::string literal;
  std::vector<int> widths;
  std::vector<size_t> at;
  if (!walk(pattern, &literal, &widths, &at, nullptr) || widths.size() != 2) return literal;
  return literal.substr(0, at[0]) + padded(step, widths[0]) + literal.substr(at[0], at[1] - at[0]) +
         padded(prompt, widths[1]) + literal.substr(at[1]);
}

}  // namespace videotrain
