#include "prompt_file.h"

#include <glib.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <map>

#include "csv_scan.h"
#include "regular_file.h"
#include "utf8_cut.h"

namespace videotrain {
namespace {

enum Column { kPrompt, kNegative, kSeed, kFrames, kWidth, kHeight, kImage, kLastImage, kColumns };

std::string lower_trim(const std::string &s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) a++;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) b--;
  std::string out = s.substr(a, b - a);
  for (char &c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string trim(const std::string &s) {
  size_t a = 0, b = s.size();
  while (a < b && (s[a] == ' ' || s[a] == '\t' || s[a] == '\r')) a++;
  while (b > a && (s[b - 1] == ' ' || s[b - 1] == '\t' || s[b - 1] == '\r')) b--;
  return s.substr(a, b - a);
}

int column_of(const std::string &name) {
  static const std::map<std::string, int> names = {
      {"prompt", kPrompt}, {"caption", kPrompt}, {"negative_prompt", kNegative}, {"negative prompt", kNegative},
      {"negative", kNegative}, {"seed", kSeed}, {"num_frames", kFrames}, {"frames", kFrames},
      {"width", kWidth}, {"height", kHeight}, {"image", kImage}, {"image_path", kImage}, {"first_image", kImage},
      {"last_image", kLastImage}};
  auto it = names.find(name);
  return it == names.end() ? -1 : it->second;
}

// Lines of a text with their numbers (plain prompt files and the CSV header).
struct Line {
  size_t n, offset;
  std::string text;
};
std::vector<Line> lines_of(const std::string &text) {
  std::vector<Line> out;
  size_t n = 1, start = 0;
  for (size_t i = 0; i <= text.size(); i++) {
    if (i == text.size() || text[i] == '\n') {
      if (i > start || i < text.size()) out.push_back({n, start, text.substr(start, i - start)});
      n++;
      start = i + 1;
    }
  }
  return out;
}

bool parse_int(const std::string &field, int64_t lo, int64_t hi, int64_t *out) {
  const std::string s = trim(field);
  if (s.empty()) return false;
  errno = 0;
  char *end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size() || v < lo || v > hi) return false;
  *out = v;
  return true;
}

bool is_blank(const std::string &s) { return trim(s).empty(); }

// Whether a first line is a CSV header: every field a known column name, `prompt` among them.
bool header_columns(const std::string &line, std::vector<int> *cols) {
  if (line.find(',') == std::string::npos && lower_trim(line) != "prompt") return false;
  bool has_prompt = false;
  cols->clear();
  size_t from = 0;
  for (;;) {
    const size_t comma = line.find(',', from);
    const std::string f = line.substr(from, comma == std::string::npos ? std::string::npos : comma - from);
    const int c = column_of(lower_trim(f));
    if (c < 0) return false;
    has_prompt |= c == kPrompt;
    cols->push_back(c);
    if (comma == std::string::npos) break;
    from = comma + 1;
  }
  return has_prompt;
}

}  // namespace

namespace {

// One prompt from a CSV record's values (in header order); false with *error on a bad value.
bool prompt_of_record(const std::vector<int> &cols, const std::vector<std::string> &values, const std::string &where,
                      Prompt *p, std::string *error) {
  static const char *names[] = {"prompt", "negative_prompt", "seed", "num_frames", "width", "height", "image",
                                "last_image"};
  for (size_t i = 0; i < cols.size() && i < values.size(); i++) {
    const std::string &f = values[i];
    const auto bad = [&](const char *range) {
      *error = where + ": " + names[cols[i]] + " '" + trim(f).substr(0, 40) + "' is not " + range;
      return false;
    };
    switch (cols[i]) {
      case kPrompt: p->text = trim(f); break;
      case kNegative: p->negative = trim(f); break;
      case kSeed:
        if (!is_blank(f) && !parse_int(f, 0, INT64_MAX, &p->seed)) return bad("an integer >= 0");
        break;
      case kFrames:
        if (!is_blank(f) && !parse_int(f, 1, 100000, &p->frames)) return bad("an integer in 1..100000");
        break;
      case kWidth:
        if (!is_blank(f) && !parse_int(f, 8, 16384, &p->width)) return bad("an integer in 8..16384");
        break;
      case kHeight:
        if (!is_blank(f) && !parse_int(f, 8, 16384, &p->height)) return bad("an integer in 8..16384");
        break;
      case kImage: p->image = trim(f); break;
      case kLastImage: p->last_image = trim(f); break;
    }
  }
  return true;
}

}  // namespace

bool read_prompts(int fd, uint64_t size, const PromptFileLimits &limits, std::vector<Prompt> *out,
                  std::vector<std::string> *warnings, std::string *error) {
  out->clear();
  if (size > limits.max_file_bytes) {
    *error = "is " + std::to_string(size) + " bytes, more than a prompt file may be (" +
             std::to_string(limits.max_file_bytes) + ")";
    return false;
  }
  std::string text(size, '\0');
  for (uint64_t off = 0; off < size;) {
    const ssize_t n = pread(fd, &text[off], size - off, off_t(off));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *error = "could not be read";
      return false;
    }
    off += uint64_t(n);
  }
  if (!g_utf8_validate(text.data(), gssize(text.size()), nullptr)) {
    *error = "is not UTF-8 text";
    return false;
  }
  // The first non-blank line that is not a comment decides the format.
  const auto lines = lines_of(text);
  std::vector<int> cols;
  bool csv = false;
  size_t header_end = 0;
  for (const auto &l : lines) {
    if (is_blank(l.text) || trim(l.text)[0] == '#') continue;
    csv = header_columns(l.text, &cols);
    header_end = l.offset + l.text.size();
    break;
  }
  const auto add = [&](Prompt p, const std::string &where) {
    if (out->size() >= limits.max_prompts) {
      *error = "has more than " + std::to_string(limits.max_prompts) + " prompts";
      return false;
    }
    for (std::string *s : {&p.text, &p.negative}) {
      if (s->size() > limits.max_prompt_bytes) {
        const size_t cut = utf8_cut(*s, limits.max_prompt_bytes);
        warnings->push_back(where + ": prompt cut to " + std::to_string(cut) + " bytes");
        s->resize(cut);
      }
    }
    p.index = static_cast<uint32_t>(out->size());
    out->push_back(std::move(p));
    return true;
  };
  if (!csv) {
    for (const auto &l : lines) {
      if (is_blank(l.text) || trim(l.text)[0] == '#') continue;
      Prompt p;
      p.text = trim(l.text);
      p.line = l.n;
      if (!add(std::move(p), "line " + std::to_string(l.n))) return false;
    }
  } else {
    std::vector<int> keep(cols.size());
    for (size_t i = 0; i < keep.size(); i++) keep[i] = int(i);
    // A value is kept up to the cap plus a character, so that a longer one is seen and cut with a warning.
    CsvRecordScanner scanner(keep, limits.max_prompt_bytes + 4);
    size_t line = 1, counted = 0;
    bool ok = true;
    const bool read = scanner.scan(fd, header_end, [&](uint64_t start, const std::vector<std::string> &values) {
      if (!ok) return;
      line += size_t(std::count(text.begin() + long(counted), text.begin() + long(start), '\n'));
      counted = start;
      const std::string where = "line " + std::to_string(line);
      bool blank = true;
      for (const auto &v : values) blank &= is_blank(v);
      if (blank) return;
      Prompt p;
      p.line = line;
      ok = prompt_of_record(cols, values, where, &p, error);
      if (ok && !p.last_image.empty() && p.image.empty()) {
        *error = where + ": last_image without image (a first-last-frame prompt gives both)";
        ok = false;
      }
      ok = ok && add(std::move(p), where);
    });
    if (!read) {
      *error = "could not be read";
      return false;
    }
    if (!ok) return false;
    if (scanner.unterminated()) {
      *error = "has a quote that never closes (the record at byte " + std::to_string(scanner.unterminated_start()) + ")";
      return false;
    }
  }
  if (out->empty()) {
    *error = csv ? "has a header but no prompts" : "has no prompts (one a line, or a CSV with a prompt column)";
    return false;
  }
  return true;
}

bool read_prompt_file(const std::string &path, const PromptFileLimits &limits, std::vector<Prompt> *out,
                      std::vector<std::string> *warnings, std::string *error) {
  RegularFile f;
  std::string why;
  if (!f.open(path, &why)) {
    *error = why;
    return false;
  }
  if (!read_prompts(f.fd(), f.size(), limits, out, warnings, &why)) {
    *error = path + " " + why;
    return false;
  }
  // Image paths are relative to the prompt file.
  gchar *dir = g_path_get_dirname(path.c_str());
  for (auto &p : *out) {
    for (std::string *s : {&p.image, &p.last_image}) {
      if (s->empty() || g_path_is_absolute(s->c_str())) continue;
      gchar *full = g_build_filename(dir, s->c_str(), nullptr);
      *s = full;
      g_free(full);
    }
  }
  g_free(dir);
  return true;
}

}  // namespace videotrain
