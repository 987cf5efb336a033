#include "row_facts.h"

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <tuple>

namespace videotrain {

bool RowFact::operator<(const RowFact &o) const {
  return std::tie(index, epoch, frames, width, height) < std::tie(o.index, o.epoch, o.frames, o.width, o.height);
}

bool RowFact::operator==(const RowFact &o) const {
  return index == o.index && epoch == o.epoch && frames == o.frames && width == o.width && height == o.height;
}

std::string format_row_facts(const std::vector<RowFact> &facts) {
  std::string out;
  char line[128];
  for (const RowFact &f : facts) {
    std::snprintf(line, sizeof line, "%" PRIu64 " %" PRIu32 " %" PRId64 " %" PRIu32 " %" PRIu32 "\n", f.index,
                  f.epoch, f.frames, f.width, f.height);
    out += line;
  }
  return out;
}

namespace {

// A decimal number of at most `max` (with an optional leading '-' for -1 only); false otherwise.
bool number(const std::string &t, uint64_t max, bool minus_one, int64_t *v) {
  if (minus_one && t == "-1") return *v = -1, true;
  if (t.empty() || t.size() > 20) return false;
  uint64_t n = 0;
  for (char c : t) {
    if (c < '0' || c > '9') return false;
    const uint64_t d = uint64_t(c - '0');
    if (n > (max - d) / 10) return false;
    n = n * 10 + d;
  }
  *v = int64_t(n);
  return true;
}

}  // namespace

bool parse_row_facts(const std::string &text, std::vector<RowFact> *out, std::string *why) {
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(at, end - at);
    at = end + 1;
    if (line.empty()) continue;
    std::vector<std::string> f;
    for (size_t i = 0; i <= line.size();) {
      const size_t sp = std::min(line.find(' ', i), line.size());
      f.push_back(line.substr(i, sp - i));
      i = sp + 1;
    }
    int64_t v[5] = {0, 0, 0, 0, 0};
    const bool ok = f.size() == 5 && number(f[0], UINT64_MAX >> 1, false, &v[0]) &&
                    number(f[1], UINT32_MAX, false, &v[1]) && number(f[2], INT64_MAX, true, &v[2]) &&
                    number(f[3], UINT32_MAX, false, &v[3]) && number(f[4], UINT32_MAX, false, &v[4]) &&
                    (v[3] == 0) == (v[4] == 0) && (v[2] >= 0 || v[3] > 0);
    if (!ok) {
      *why = "malformed row fact \"" + line.substr(0, 80) + "\"";
      return false;
    }
    RowFact r;
    r.index = uint64_t(v[0]);
    r.epoch = uint32_t(v[1]);
    r.frames = v[2];
    r.width = uint32_t(v[3]);
    r.height = uint32_t(v[4]);
    out->push_back(r);
  }
  return true;
}

void normalise_row_facts(std::vector<RowFact> *facts) {
  std::sort(facts->begin(), facts->end());
  facts->erase(std::unique(facts->begin(), facts->end()), facts->end());
}

}  // namespace videotrain
