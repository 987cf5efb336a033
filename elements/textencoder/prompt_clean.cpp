/* pipeline_wan.prompt_clean: see prompt_clean.h. */
#include "prompt_clean.h"

#include <cctype>
#include <cstdint>
#include <cstring>

namespace videotrain::text {

namespace {

void put_utf8(uint32_t cp, std::string *out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// One code point at s[i] (advancing i); an invalid byte is taken as itself (never whitespace).
uint32_t next_cp(const std::string &s, size_t *i) {
  const auto b = static_cast<unsigned char>(s[*i]);
  int n = b < 0x80 ? 0 : (b >> 5) == 6 ? 1 : (b >> 4) == 14 ? 2 : (b >> 3) == 30 ? 3 : -1;
  if (n < 0 || *i + n >= s.size() + (n == 0 ? 1 : 0)) {
    (*i)++;
    return 0xFFFFFFFF;
  }
  uint32_t cp = n == 0 ? b : b & (0x3F >> n);
  for (int k = 1; k <= n; k++) {
    const auto c = static_cast<unsigned char>(s[*i + k]);
    if ((c >> 6) != 2) {
      (*i)++;
      return 0xFFFFFFFF;
    }
    cp = (cp << 6) | (c & 0x3F);
  }
  *i += n + 1;
  return cp;
}

bool is_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

struct Named {
  const char *name;
  uint32_t cp;
};
// The HTML entities that occur in scraped captions; html.unescape knows all 2231 of HTML5.
const Named kNamed[] = {
    {"amp", '&'},       {"lt", '<'},        {"gt", '>'},        {"quot", '"'},      {"apos", '\''},
    {"nbsp", 0xA0},     {"copy", 0xA9},     {"reg", 0xAE},      {"trade", 0x2122},  {"hellip", 0x2026},
    {"mdash", 0x2014},  {"ndash", 0x2013},  {"lsquo", 0x2018},  {"rsquo", 0x2019},  {"ldquo", 0x201C},
    {"rdquo", 0x201D},  {"laquo", 0xAB},    {"raquo", 0xBB},    {"deg", 0xB0},      {"times", 0xD7},
    {"middot", 0xB7},   {"bull", 0x2022},   {"euro", 0x20AC},   {"pound", 0xA3},    {"yen", 0xA5},
    {"cent", 0xA2},     {"sect", 0xA7},     {"para", 0xB6},     {"eacute", 0xE9},   {"egrave", 0xE8},
    {"aacute", 0xE1},   {"agrave", 0xE0},   {"ouml", 0xF6},     {"uuml", 0xFC},     {"auml", 0xE4},
    {"szlig", 0xDF},    {"ccedil", 0xE7},   {"ntilde", 0xF1},   {"iexcl", 0xA1},    {"iquest", 0xBF},
    {"shy", 0xAD},      {"ensp", 0x2002},   {"emsp", 0x2003},   {"thinsp", 0x2009}, {"frac12", 0xBD},
};
// html.unescape's reading of &#128;..&#159; (Windows-1252; 0x81, 0x8D, 0x8F, 0x90, 0x9D stay, then drop).
const uint32_t kCp1252[32] = {0x20AC, 0x81,   0x201A, 0x192,  0x201E, 0x2026, 0x2020, 0x2021, 0x2C6,  0x2030, 0x160,
                              0x2039, 0x152,  0x8D,   0x17D,  0x8F,   0x90,   0x2018, 0x2019, 0x201C, 0x201D, 0x2022,
                              0x2013, 0x2014, 0x2DC,  0x2122, 0x161,  0x203A, 0x153,  0x9D,   0x17E,  0x178};
// Named without ';' (html.unescape's legacy forms for these).
const char *kNoSemicolon[] = {"amp", "lt", "gt", "quot", "nbsp", "copy", "reg"};

}  // namespace

std::string html_unescape(const std::string &s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (s[i] != '&') {
      out.push_back(s[i++]);
      continue;
    }
    size_t j = i + 1;
    if (j < s.size() && s[j] == '#') {
      const bool hex = j + 1 < s.size() && (s[j + 1] == 'x' || s[j + 1] == 'X');
      size_t k = j + 1 + (hex ? 1 : 0);
      uint64_t v = 0;
      size_t digits = 0;
      for (; k < s.size(); k++, digits++) {
        const auto c = static_cast<unsigned char>(s[k]);
        if (!(hex ? std::isxdigit(c) : std::isdigit(c))) break;
        const uint64_t d = std::isdigit(c) ? c - '0' : (c | 0x20) - 'a' + 10;
        if (v < 0x110000) v = v * (hex ? 16 : 10) + d;  // past U+10FFFF the value only needs to stay large
      }
      if (digits == 0) {
        out.push_back(s[i++]);
        continue;
      }
      if (k < s.size() && s[k] == ';') k++;
      // Python: 0, surrogates and beyond U+10FFFF become U+FFFD; 0x80-0x9F are read as cp1252 (and \r for
      // 0x0D); control characters and noncharacters are dropped.
      const bool remapped = v == 0 || v == 0x0D || (v >= 0x80 && v <= 0x9F);
      uint32_t cp = v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF) ? 0xFFFD : static_cast<uint32_t>(v);
      if (remapped) cp = v == 0 ? 0xFFFD : v == 0x0D ? 0x0D : kCp1252[v - 0x80];
      const bool dropped = !remapped && ((cp >= 0x1 && cp <= 0x8) || cp == 0xB || (cp >= 0xE && cp <= 0x1F) ||
                                         (cp >= 0x7F && cp <= 0x9F) || (cp >= 0xFDD0 && cp <= 0xFDEF) ||
                                         (cp & 0xFFFE) == 0xFFFE);
      if (!dropped) put_utf8(cp, &out);
      i = k;
      continue;
    }
    size_t k = j;
    while (k < s.size() && std::isalnum(static_cast<unsigned char>(s[k]))) k++;
    const std::string name = s.substr(j, k - j);
    bool done = false;
    if (k < s.size() && s[k] == ';') {
      for (const auto &n : kNamed)
        if (name == n.name) {
          put_utf8(n.cp, &out);
          i = k + 1;
          done = true;
          break;
        }
    } else {
      for (const char *n : kNoSemicolon)
        if (name == n) {
          for (const auto &m : kNamed)
            if (name == m.name) put_utf8(m.cp, &out);
          i = k;
          done = true;
          break;
        }
    }
    if (!done) out.push_back(s[i++]);
  }
  return out;
}

std::string whitespace_clean(const std::string &s) {
  std::string out;
  out.reserve(s.size());
  bool pending_space = false;
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    const uint32_t cp = next_cp(s, &i);
    if (is_space(cp)) {
      pending_space = !out.empty();
      continue;
    }
    if (pending_space) out.push_back(' ');
    pending_space = false;
    out.append(s, start, i - start);
  }
  return out;
}

std::string prompt_clean(const std::string &s) { return whitespace_clean(html_unescape(html_unescape(s))); }

}  // namespace videotrain::text
