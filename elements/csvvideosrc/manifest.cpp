#include "manifest.h"

#include <fcntl.h>
#include <glib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace videotrain {

namespace {

const char *kPathColumns[] = {"path", "video", "video_path", "file", "filename"};
const char *kCaptionColumns[] = {"text", "caption", "prompt"};

std::string trim(const std::string &s) {
  size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

std::string lower(std::string s) {
  for (char &c : s) c = char(g_ascii_tolower(c));
  return s;
}

bool has_bom(int fd) {
  unsigned char b[3];
  return pread(fd, b, 3, 0) == 3 && b[0] == 0xEF && b[1] == 0xBB && b[2] == 0xBF;
}

// Reads from `offset` until a whole record (csv) or line is in `text`, or EOF.
std::string read_from(int fd, uint64_t offset, bool csv, size_t *end) {
  std::string text;
  size_t chunk = 4096;
  for (;;) {
    size_t old = text.size();
    text.resize(old + chunk);
    ssize_t n = pread(fd, &text[old], chunk, off_t(offset + old));
    if (n < 0 && errno == EINTR) {
      text.resize(old);
      continue;
    }
    text.resize(old + size_t(std::max<ssize_t>(n, 0)));
    bool eof = n <= 0 || size_t(n) < chunk;
    if (csv) {
      // Quotes toggle; a newline outside quotes ends the record.
      bool inq = false;
      for (size_t i = 0; i < text.size(); i++) {
        if (text[i] == '"') inq = !inq;
        else if (text[i] == '\n' && !inq) {
          *end = i + 1;
          return text;
        }
      }
    } else if (size_t nl = text.find('\n'); nl != std::string::npos) {
      *end = nl + 1;
      return text;
    }
    if (eof) {
      *end = text.size();
      return text;
    }
    chunk = std::min<size_t>(chunk * 2, 16u << 20);
  }
}

// Line starts of a text file; trailing empty lines are not rows.
bool index_lines(int fd, std::vector<uint64_t> *offsets) {
  std::vector<char> buf(1 << 20);
  uint64_t base = 0, start = 0;
  bool empty = true;
  size_t keep = 0;  // lines up to the last non-empty one
  for (;;) {
    ssize_t n = pread(fd, buf.data(), buf.size(), off_t(base));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    if (n == 0) break;
    for (ssize_t i = 0; i < n; i++) {
      char c = buf[size_t(i)];
      if (c == '\n') {
        offsets->push_back(start);
        if (!empty) keep = offsets->size();
        start = base + uint64_t(i) + 1;
        empty = true;
      } else if (c != '\r' && c != ' ' && c != '\t') {
        empty = false;
      }
    }
    base += uint64_t(n);
  }
  if (!empty) {
    offsets->push_back(start);
    keep = offsets->size();
  }
  offsets->resize(keep);
  return true;
}

std::string strip_eol(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s;
}

}  // namespace

std::vector<std::string> parse_csv_record(const std::string &text, size_t pos, size_t *end) {
  std::vector<std::string> fields;
  std::string f;
  bool inq = false;
  size_t i = pos, n = text.size();
  while (i < n) {
    char c = text[i];
    if (inq) {
      if (c == '"') {
        if (i + 1 < n && text[i + 1] == '"') {
          f += '"';
          i += 2;
        } else {
          inq = false;
          i++;
        }
      } else {
        f += c;
        i++;
      }
      continue;
    }
    if (c == '"') {
      inq = true;
      i++;
    } else if (c == ',') {
      fields.push_back(std::move(f));
      f.clear();
      i++;
    } else if (c == '\n') {
      i++;
      break;
    } else if (c == '\r' && (i + 1 >= n || text[i + 1] == '\n')) {
      i++;  // the \n ends the record next
    } else {
      f += c;
      i++;
    }
  }
  fields.push_back(std::move(f));
  if (end) *end = i;
  return fields;
}

Manifest::~Manifest() {
  if (fd_ >= 0) close(fd_);
  if (prompts_fd_ >= 0) close(prompts_fd_);
}

std::unique_ptr<Manifest> Manifest::open(const ManifestOptions &opts, std::string *error) {
  std::unique_ptr<Manifest> m(new Manifest());
  struct stat st;
  if (stat(opts.location.c_str(), &st) != 0) {
    *error = "cannot open manifest " + opts.location + ": " + std::strerror(errno);
    return nullptr;
  }
  bool ok = S_ISDIR(st.st_mode) ? m->open_folder(opts, error) : m->open_csv(opts, error);
  if (!ok) return nullptr;
  m->offsets_.shrink_to_fit();
  m->prompt_offsets_.shrink_to_fit();
  m->row_numbers_.shrink_to_fit();
  return m;
}

static std::string absolute_dir(const std::string &dir) {
  gchar *cwd = g_get_current_dir();
  gchar *abs = g_canonicalize_filename(dir.empty() ? "." : dir.c_str(), cwd);
  std::string r = abs;
  g_free(abs);
  g_free(cwd);
  return r;
}

bool Manifest::open_csv(const ManifestOptions &opts, std::string *error) {
  csv_ = true;
  const std::string &loc = opts.location;
  fd_ = ::open(loc.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) {
    *error = "cannot open manifest " + loc + ": " + std::strerror(errno);
    return false;
  }
  gchar *dir = g_path_get_dirname(loc.c_str());
  base_ = absolute_dir(opts.root.empty() ? dir : opts.root);
  g_free(dir);

  const uint64_t header_at = has_bom(fd_) ? 3 : 0;
  size_t end = 0;
  std::string text = read_from(fd_, header_at, true, &end);
  if (trim(text).empty()) {
    *error = "manifest " + loc + " is empty: expected a header row such as 'path,text'";
    return false;
  }
  std::vector<std::string> header = parse_csv_record(text, 0, nullptr);
  if (!g_utf8_validate(text.data(), gssize(end), nullptr)) {
    *error = "manifest " + loc + " has a header that is not UTF-8";
    return false;
  }
  std::vector<std::string> names;
  for (auto &h : header) names.push_back(lower(trim(h)));
  auto find = [&](const std::string &wanted) -> int {
    auto it = std::find(names.begin(), names.end(), lower(trim(wanted)));
    return it == names.end() ? -1 : int(it - names.begin());
  };
  std::string header_list;
  for (auto &h : header) header_list += (header_list.empty() ? "" : ", ") + trim(h);
  if (!opts.path_column.empty()) {
    path_col_ = find(opts.path_column);
    if (path_col_ < 0) {
      *error = "manifest " + loc + " has no column '" + opts.path_column + "' (path-column); header has: " +
               header_list;
      return false;
    }
  } else {
    for (const char *c : kPathColumns)
      if ((path_col_ = find(c)) >= 0) break;
    if (path_col_ < 0) {
      *error = "manifest " + loc +
               " has no path column: looked for path, video, video_path, file, filename; header has: " + header_list;
      return false;
    }
  }
  if (!opts.caption_column.empty()) {
    caption_col_ = find(opts.caption_column);
    if (caption_col_ < 0) {
      *error = "manifest " + loc + " has no column '" + opts.caption_column + "' (caption-column); header has: " +
               header_list;
      return false;
    }
  } else {
    for (const char *c : kCaptionColumns)
      if ((caption_col_ = find(c)) >= 0) break;
  }
  split_col_ = find("split");
  if (!opts.split.empty() && split_col_ < 0) {
    *error = "manifest " + loc + " has no 'split' column, but split=" + opts.split + " was asked for";
    return false;
  }

  // One pass over the data: record starts (and each record's split value when filtering).
  const bool filter = !opts.split.empty();
  std::vector<char> buf(1 << 20);
  uint64_t base = header_at + end, start = base, row = 0;
  bool inq = false, empty = true;
  int field = 0;
  std::string split_value;
  auto end_record = [&] {
    if (!empty) {
      if (!filter) {
        offsets_.push_back(start);
      } else if (trim(split_value) == opts.split) {
        offsets_.push_back(start);
        row_numbers_.push_back(uint32_t(row));
      }
      row++;
    }
    empty = true;
    field = 0;
    split_value.clear();
  };
  for (;;) {
    ssize_t n = pread(fd_, buf.data(), buf.size(), off_t(base));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *error = "cannot read manifest " + loc + ": " + std::strerror(errno);
      return false;
    }
    if (n == 0) break;
    for (ssize_t i = 0; i < n; i++) {
      const char c = buf[size_t(i)];
      if (c == '"') {
        inq = !inq;
        empty = false;
      } else if (inq) {
        if (filter && field == split_col_) split_value += c;
      } else if (c == '\n') {
        end_record();
        start = base + uint64_t(i) + 1;
      } else if (c != '\r') {
        empty = false;
        if (c == ',') field++;
        else if (filter && field == split_col_) split_value += c;
      }
    }
    base += uint64_t(n);
  }
  end_record();
  // Row numbers are only needed when rows were dropped.
  if (filter && row_numbers_.size() == row) row_numbers_.clear();
  if (row > UINT32_MAX && filter) {
    *error = "manifest " + loc + " has more than 2^32 rows";
    return false;
  }
  description_ = loc + " (CSV, " + std::to_string(offsets_.size()) + " rows" +
                 (filter ? " of " + std::to_string(row) + " with split '" + opts.split + "'" : std::string()) +
                 ", path column '" + trim(header[size_t(path_col_)]) + "'" +
                 (caption_col_ >= 0 ? ", caption column '" + trim(header[size_t(caption_col_)]) + "'"
                                    : std::string(", no caption column")) +
                 ")";
  return true;
}

bool Manifest::open_folder(const ManifestOptions &opts, std::string *error) {
  csv_ = false;
  const std::string videos = opts.location + "/videos.txt", prompts = opts.location + "/prompts.txt";
  fd_ = ::open(videos.c_str(), O_RDONLY | O_CLOEXEC);
  prompts_fd_ = ::open(prompts.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0 || prompts_fd_ < 0) {
    *error = "manifest folder " + opts.location + " needs videos.txt and prompts.txt (CogVideo layout): cannot open " +
             (fd_ < 0 ? videos : prompts) + ": " + std::strerror(errno);
    return false;
  }
  if (!opts.split.empty()) {
    *error = "manifest folder " + opts.location + " (CogVideo layout) has no split column, but split=" + opts.split +
             " was asked for";
    return false;
  }
  base_ = absolute_dir(opts.root.empty() ? opts.location : opts.root);
  if (!index_lines(fd_, &offsets_) || !index_lines(prompts_fd_, &prompt_offsets_)) {
    *error = "cannot read " + videos + " or " + prompts + ": " + std::strerror(errno);
    return false;
  }
  if (offsets_.size() != prompt_offsets_.size()) {
    *error = "manifest folder " + opts.location + ": videos.txt has " + std::to_string(offsets_.size()) +
             " lines but prompts.txt has " + std::to_string(prompt_offsets_.size()) + "; they must pair line by line";
    return false;
  }
  if (has_bom(fd_) && !offsets_.empty()) offsets_[0] = 3;
  if (has_bom(prompts_fd_) && !prompt_offsets_.empty()) prompt_offsets_[0] = 3;
  description_ = opts.location + " (CogVideo folder, " + std::to_string(offsets_.size()) + " rows)";
  return true;
}

std::vector<std::string> Manifest::read_record(int fd, uint64_t offset, bool csv) const {
  size_t end = 0;
  std::string text = read_from(fd, offset, csv, &end);
  text.resize(end);
  if (csv) return parse_csv_record(text, 0, nullptr);
  return {strip_eol(text)};
}

size_t Manifest::size() const { return offsets_.size(); }

ManifestRow Manifest::row(size_t index) const {
  ManifestRow r;
  if (index >= offsets_.size()) {
    r.error = "row index " + std::to_string(index) + " is outside the manifest";
    return r;
  }
  r.row = row_numbers_.empty() ? index : row_numbers_[index];
  std::string path;
  if (csv_) {
    std::vector<std::string> f = read_record(fd_, offsets_[index], true);
    if (int(f.size()) <= path_col_) {
      r.error = "row has " + std::to_string(f.size()) + " fields, too few for the path column";
      return r;
    }
    path = trim(f[size_t(path_col_)]);
    if (caption_col_ >= 0 && int(f.size()) > caption_col_) r.caption = f[size_t(caption_col_)];
    if (split_col_ >= 0 && int(f.size()) > split_col_) r.split = trim(f[size_t(split_col_)]);
  } else {
    path = trim(read_record(fd_, offsets_[index], false)[0]);
    r.caption = trim(read_record(prompts_fd_, prompt_offsets_[index], false)[0]);
  }
  if (!g_utf8_validate(path.data(), gssize(path.size()), nullptr) ||
      !g_utf8_validate(r.caption.data(), gssize(r.caption.size()), nullptr)) {
    r.error = "bad UTF-8 in the path or caption";
    r.caption.clear();
    r.path = g_utf8_validate(path.data(), gssize(path.size()), nullptr) ? path : "(not UTF-8)";
    return r;
  }
  if (path.empty()) {
    r.error = "empty path";
    return r;
  }
  if (g_path_is_absolute(path.c_str())) {
    r.path = path;
  } else {
    gchar *p = g_build_filename(base_.c_str(), path.c_str(), nullptr);
    r.path = p;
    g_free(p);
  }
  return r;
}

const std::string &Manifest::description() const { return description_; }

size_t Manifest::index_bytes() const {
  return offsets_.capacity() * sizeof(uint64_t) + prompt_offsets_.capacity() * sizeof(uint64_t) +
         row_numbers_.capacity() * sizeof(uint32_t);
}

}  // namespace videotrain
