#include "manifest.h"

#include "csv_scan.h"
#include "utf8_cut.h"
#include "regular_file.h"

#include <fcntl.h>
#include <glib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

namespace videotrain {

namespace {

const char *kPathColumns[] = {"path", "video", "video_path", "file", "filename"};
const char *kCaptionColumns[] = {"text", "caption", "prompt"};
// A row longer than this is reported as unusable rather than read into memory.
constexpr size_t kMaxRecord = 64u << 20;
// Indexing reads the file in blocks this large.
constexpr size_t kScanBlock = 4u << 20;

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

ssize_t pread_full(int fd, char *buf, size_t len, uint64_t offset) {
  for (;;) {
    ssize_t n = pread(fd, buf, len, off_t(offset));
    if (n >= 0 || errno != EINTR) return n;
  }
}

enum class Read { kOk, kTooLong, kError };

// Reads from `offset` until a whole record (csv: a newline outside quotes) or line is in
// *text, or EOF; *end is the record's length including its newline.
Read read_from(int fd, uint64_t offset, bool csv, std::string *text, size_t *end) {
  text->clear();
  size_t chunk = 2048, scanned = 0;
  bool inq = false;
  for (;;) {
    const size_t old = text->size();
    text->resize(old + chunk);
    ssize_t n = pread_full(fd, &(*text)[old], chunk, offset + old);
    if (n < 0) return Read::kError;
    text->resize(old + size_t(n));
    // Resume the quote state where the previous block stopped.
    for (size_t i = scanned; i < text->size(); i++) {
      const char c = (*text)[i];
      if (csv && c == '"') {
        inq = !inq;
      } else if (c == '\n' && !inq) {
        *end = i + 1;
        return Read::kOk;
      }
    }
    scanned = text->size();
    if (size_t(n) < chunk) {
      *end = text->size();
      return Read::kOk;
    }
    if (text->size() >= kMaxRecord) return Read::kTooLong;
    chunk = std::min<size_t>(chunk * 2, 8u << 20);
  }
}

// Starts of the non-blank lines of a text file, from `from` (past a BOM).
bool index_lines(int fd, uint64_t from, std::vector<uint64_t> *offsets) {
  std::unique_ptr<char[]> buf(new char[kScanBlock]);
  uint64_t base = from, start = from;
  bool blank = true;
  for (;;) {
    ssize_t n = pread_full(fd, buf.get(), kScanBlock, base);
    if (n < 0) return false;
    if (n == 0) break;
    const char *p = buf.get(), *e = p + n, *i = p;
    while (i < e) {
      const char *nl = static_cast<const char *>(memchr(i, '\n', size_t(e - i)));
      const char *stop = nl ? nl : e;
      for (const char *c = i; blank && c < stop; c++)
        if (*c != ' ' && *c != '\t' && *c != '\r') blank = false;
      if (!nl) break;
      if (!blank) offsets->push_back(start);
      blank = true;
      i = nl + 1;
      start = base + uint64_t(i - p);
    }
    base += uint64_t(n);
  }
  if (!blank) offsets->push_back(start);
  return true;
}

std::string strip_eol(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s;
}

std::string absolute_dir(const std::string &dir) {
  gchar *cwd = g_get_current_dir();
  gchar *abs = g_canonicalize_filename(dir.empty() ? "." : dir.c_str(), cwd);
  std::string r = abs;
  g_free(abs);
  g_free(cwd);
  return r;
}

// A size column's value: a positive number, else 0 (unknown: empty, 0, or not a number).
double positive(const std::string &text, double max) {
  const std::string v = trim(text);
  char *end = nullptr;
  const double x = g_ascii_strtod(v.c_str(), &end);
  return !v.empty() && end && *end == '\0' && std::isfinite(x) && x > 0 && x <= max ? x : 0;
}

VideoSize parse_size(const std::string &frames, const std::string &height, const std::string &width,
                     const std::string &fps) {
  VideoSize s;
  s.frames = uint32_t(positive(frames, 4e9));
  s.height = uint32_t(positive(height, 1 << 20));
  s.width = uint32_t(positive(width, 1 << 20));
  s.fps = float(positive(fps, 1000));
  return s;
}

bool utf8(const std::string &s) { return g_utf8_validate(s.data(), gssize(s.size()), nullptr); }

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
        // Copy the run up to the next quote at once.
        size_t q = text.find('"', i);
        if (q == std::string::npos) q = n;
        f.append(text, i, q - i);
        i = q;
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
      // Copy the run of plain characters at once.
      size_t stop = text.find_first_of(",\"\r\n", i + 1);
      if (stop == std::string::npos) stop = n;
      f.append(text, i, stop - i);
      i = stop;
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

// A manifest file's descriptor: a regular file only (a FIFO would block the open and every read).
static int open_manifest_file(const std::string &path, std::string *why) {
  RegularFile f;
  return f.open(path, why) ? f.release() : -1;
}

std::unique_ptr<Manifest> Manifest::open(const ManifestOptions &opts, std::string *error) {
  std::unique_ptr<Manifest> m(new Manifest());
  if (opts.location.empty()) {
    *error = "no manifest given: set location to a CSV file or a CogVideo folder (videos.txt + prompts.txt)";
    return nullptr;
  }
  struct stat st;
  if (stat(opts.location.c_str(), &st) != 0) {
    *error = "cannot open manifest " + opts.location + ": " + std::strerror(errno);
    return nullptr;
  }
  m->max_caption_bytes_ = opts.max_caption_bytes;
  bool ok = S_ISDIR(st.st_mode) ? m->open_folder(opts, error) : m->open_csv(opts, error);
  if (!ok) return nullptr;
  m->offsets_.shrink_to_fit();
  m->prompt_offsets_.shrink_to_fit();
  m->row_numbers_.shrink_to_fit();
  // Sizes are asked for by index; a folder (or a CSV without the columns) has them all unknown.
  if (opts.sizes) m->sizes_.resize(m->offsets_.size());
  m->sizes_.shrink_to_fit();
  return m;
}

// The header is the first non-blank record: its fields, and where the data starts.
bool Manifest::read_header(const std::string &loc, std::vector<std::string> *header, uint64_t *data_at,
                           std::string *error) {
  uint64_t header_at = has_bom(fd_) ? 3 : 0;
  size_t end = 0;
  std::string text;
  for (;;) {
    Read r = read_from(fd_, header_at, true, &text, &end);
    if (r != Read::kOk) {
      *error = r == Read::kTooLong ? "manifest " + loc + " has a header row longer than 64 MiB (unbalanced quote?)"
                                   : "cannot read manifest " + loc + ": " + std::strerror(errno);
      return false;
    }
    if (end == 0) {
      *error = "manifest " + loc + " is empty: expected a header row such as 'path,text'";
      return false;
    }
    text.resize(end);
    if (!trim(text).empty()) break;
    header_at += end;
  }
  if (std::count(text.begin(), text.end(), '"') % 2 != 0) {
    *error = "manifest " + loc + " has a quote that never closes in its header row";
    return false;
  }
  if (!utf8(text)) {
    *error = "manifest " + loc + " has a header row that is not UTF-8";
    return false;
  }
  *header = parse_csv_record(text, 0, nullptr);
  *data_at = header_at + end;
  return true;
}

// Column numbers from the header (names match without case or surrounding blanks).
bool Manifest::resolve_columns(const ManifestOptions &opts, const std::vector<std::string> &header,
                               std::string *error) {
  std::vector<std::string> names;
  std::string header_list;
  for (auto &h : header) {
    names.push_back(lower(trim(h)));
    header_list += (header_list.empty() ? "" : ", ") + trim(h);
  }
  auto find = [&](const std::string &wanted) -> int {
    auto it = std::find(names.begin(), names.end(), lower(trim(wanted)));
    return it == names.end() ? -1 : int(it - names.begin());
  };
  auto missing = [&](const std::string &what) {
    *error = "manifest " + opts.location + " has no " + what + "; header has: " + header_list;
    return false;
  };
  if (!opts.path_column.empty()) {
    if ((path_col_ = find(opts.path_column)) < 0) return missing("column '" + opts.path_column + "' (path-column)");
  } else {
    for (const char *c : kPathColumns)
      if ((path_col_ = find(c)) >= 0) break;
    if (path_col_ < 0) {
      missing("path column: looked for path, video, video_path, file, filename");
      *error += " (set path-column to choose one)";
      return false;
    }
  }
  if (!opts.caption_column.empty()) {
    if ((caption_col_ = find(opts.caption_column)) < 0)
      return missing("column '" + opts.caption_column + "' (caption-column)");
  } else {
    for (const char *c : kCaptionColumns)
      if ((caption_col_ = find(c)) >= 0) break;
    if (caption_col_ < 0)
      warnings_.push_back("manifest " + opts.location +
                          " has no caption column (looked for text, caption, prompt; header has: " + header_list +
                          "): every caption is empty (set caption-column to choose one)");
  }
  split_col_ = find("split");
  fps_col_ = find("fps");
  if (opts.sizes) {
    frames_col_ = find("num_frames");
    height_col_ = find("height");
    width_col_ = find("width");
  }
  if (!opts.split.empty() && split_col_ < 0)
    return missing("'split' column, but split=" + opts.split + " was asked for");
  return true;
}

bool Manifest::open_csv(const ManifestOptions &opts, std::string *error) {
  csv_ = true;
  const std::string &loc = opts.location;
  std::string why;
  fd_ = open_manifest_file(loc, &why);
  if (fd_ < 0) {
    *error = "cannot open manifest " + why;
    return false;
  }
  gchar *dir = g_path_get_dirname(loc.c_str());
  base_ = absolute_dir(opts.root.empty() ? dir : opts.root);
  g_free(dir);
  std::vector<std::string> header;
  uint64_t data_at = 0;
  if (!read_header(loc, &header, &data_at, error) || !resolve_columns(opts, header, error)) return false;

  // One pass over the data keeps each record's start, and the few columns the index needs.
  const bool filter = !opts.split.empty();
  std::vector<int> kept = {filter ? split_col_ : -1, frames_col_, height_col_, width_col_, opts.sizes ? fps_col_ : -1};
  // Split values and numbers are short; the cap only bounds a runaway field.
  CsvRecordScanner scanner(kept, opts.split.size() + 4096);
  uint64_t rows = 0;
  const bool ok = scanner.scan(fd_, data_at, [&](uint64_t start, const std::vector<std::string> &v) {
    if (!filter || trim(v[0]) == opts.split) {
      offsets_.push_back(start);
      if (filter) row_numbers_.push_back(uint32_t(rows));
      if (opts.sizes) sizes_.push_back(parse_size(v[1], v[2], v[3], v[4]));
    }
    rows++;
  });
  if (!ok) {
    *error = "cannot read manifest " + loc + ": " + std::strerror(errno);
    return false;
  }
  const bool inq = scanner.unterminated();
  uint64_t unterminated_row = 0;
  if (inq) {
    unterminated_at_ = scanner.unterminated_start();
    unterminated_row = rows - 1;
    unterminated_row_ = unterminated_row;
    warnings_.push_back("manifest " + loc + " is a malformed CSV: a quote in row " + std::to_string(unterminated_row) +
                        " (data row, from 0) never closes, so that row runs to the end of the file; it is skipped, "
                        "and rows after it that the quote swallowed are lost");
  }
  if (filter && rows > UINT32_MAX) {
    *error = "manifest " + loc + " has more than 2^32 rows; split filtering supports up to 2^32";
    return false;
  }
  // Row numbers are only needed when rows were dropped.
  if (filter && row_numbers_.size() == rows) row_numbers_.clear();
  description_ = loc + " (CSV, " + std::to_string(offsets_.size()) + " rows" +
                 (filter ? " of " + std::to_string(rows) + " with split '" + opts.split + "'" : std::string()) +
                 ", path column '" + trim(header[size_t(path_col_)]) + "'" +
                 (caption_col_ >= 0 ? ", caption column '" + trim(header[size_t(caption_col_)]) + "'"
                                    : std::string(", no caption column")) +
                 (opts.sizes ? size_columns_description() : std::string()) +
                 (inq ? ", quote never closes from row " + std::to_string(unterminated_row) : std::string()) + ")";
  return true;
}

bool Manifest::open_folder(const ManifestOptions &opts, std::string *error) {
  csv_ = false;
  const std::string videos = opts.location + "/videos.txt", prompts = opts.location + "/prompts.txt";
  std::string videos_why, prompts_why;
  fd_ = open_manifest_file(videos, &videos_why);
  prompts_fd_ = open_manifest_file(prompts, &prompts_why);
  if (fd_ < 0 || prompts_fd_ < 0) {
    *error = "manifest folder " + opts.location + " is not a CogVideo dataset (videos.txt + prompts.txt): cannot open " +
             (fd_ < 0 ? videos_why : prompts_why);
    return false;
  }
  if (!opts.split.empty()) {
    *error = "manifest folder " + opts.location + " (CogVideo layout) has no split column, but split=" + opts.split +
             " was asked for";
    return false;
  }
  base_ = absolute_dir(opts.root.empty() ? opts.location : opts.root);
  if (!index_lines(fd_, has_bom(fd_) ? 3 : 0, &offsets_)) {
    *error = "cannot read " + videos + ": " + std::strerror(errno);
    return false;
  }
  if (!index_lines(prompts_fd_, has_bom(prompts_fd_) ? 3 : 0, &prompt_offsets_)) {
    *error = "cannot read " + prompts + ": " + std::strerror(errno);
    return false;
  }
  if (offsets_.size() != prompt_offsets_.size()) {
    *error = "manifest folder " + opts.location + ": " + videos + " has " + std::to_string(offsets_.size()) +
             " lines but " + prompts + " has " + std::to_string(prompt_offsets_.size()) +
             " (blank lines not counted); they must pair line by line";
    return false;
  }
  description_ = opts.location + " (CogVideo folder, " + std::to_string(offsets_.size()) + " rows)";
  return true;
}

bool Manifest::read_record(int fd, uint64_t offset, bool csv, std::vector<std::string> *fields,
                           std::string *error) const {
  size_t end = 0;
  std::string text;
  Read r = read_from(fd, offset, csv, &text, &end);
  if (r != Read::kOk) {
    *error = r == Read::kTooLong ? "row is longer than 64 MiB"
                                 : std::string("cannot read the manifest: ") + std::strerror(errno);
    return false;
  }
  text.resize(end);
  if (csv)
    *fields = parse_csv_record(text, 0, nullptr);
  else
    *fields = {strip_eol(std::move(text))};
  return true;
}

size_t Manifest::size() const { return offsets_.size(); }

VideoSize Manifest::video_size(size_t index) const {
  std::lock_guard<std::mutex> g(sizes_lock_);
  return index < sizes_.size() ? sizes_[index] : VideoSize();
}

void Manifest::set_video_size(size_t index, const VideoSize &size) {
  std::lock_guard<std::mutex> g(sizes_lock_);
  if (index < sizes_.size()) sizes_[index] = size;
}

std::string Manifest::size_columns_description() const {
  std::string cols;
  for (auto c : {std::make_pair(frames_col_, "num_frames"), std::make_pair(height_col_, "height"),
                 std::make_pair(width_col_, "width"), std::make_pair(fps_col_, "fps")})
    if (c.first >= 0) cols += std::string(cols.empty() ? "" : ", ") + c.second;
  return cols.empty() ? ", no size columns" : ", size columns " + cols;
}

ManifestRow Manifest::row(size_t index) const {
  ManifestRow r;
  if (index >= offsets_.size()) {
    r.error = "row index " + std::to_string(index) + " is outside the manifest (" + std::to_string(offsets_.size()) +
              " rows)";
    return r;
  }
  r.row = row_numbers_.empty() ? index : row_numbers_[index];
  if (csv_ && offsets_[index] == unterminated_at_) {
    r.error = "malformed CSV: a quote in row " + std::to_string(unterminated_row_) +
              " never closes (the row runs to the end of the file)";
    return r;
  }
  std::string path;
  std::vector<std::string> f;
  if (!read_record(fd_, offsets_[index], csv_, &f, &r.error)) return r;
  if (csv_) {
    if (int(f.size()) <= path_col_) {
      r.error = "row has " + std::to_string(f.size()) + " fields, too few for the path column (field " +
                std::to_string(path_col_ + 1) + ")";
      return r;
    }
    path = trim(f[size_t(path_col_)]);
    if (caption_col_ >= 0 && int(f.size()) > caption_col_) r.caption = std::move(f[size_t(caption_col_)]);
    if (split_col_ >= 0 && int(f.size()) > split_col_) r.split = trim(f[size_t(split_col_)]);
    if (fps_col_ >= 0 && int(f.size()) > fps_col_) {
      // Metadata, not a requirement: a value that is not a usable rate is ignored.
      const std::string v = trim(f[size_t(fps_col_)]);
      char *end = nullptr;
      double fps = g_ascii_strtod(v.c_str(), &end);
      if (!v.empty() && end && *end == '\0' && std::isfinite(fps) && fps > 0 && fps <= 1000) r.fps = fps;
    }
  } else {
    path = trim(f[0]);
    if (!read_record(prompts_fd_, prompt_offsets_[index], false, &f, &r.error)) return r;
    r.caption = trim(f[0]);
  }
  const bool path_ok = utf8(path);
  if (!path_ok || !utf8(r.caption) || !utf8(r.split)) {
    r.error = std::string("bad UTF-8 in the ") + (path_ok ? "caption" : "path");
    r.caption.clear();
    r.split.clear();
    r.path = path_ok ? path : "(not UTF-8)";
    return r;
  }
  if (r.caption.size() > max_caption_bytes_) {
    const size_t cut = utf8_cut(r.caption, max_caption_bytes_);
    r.warning = "caption of " + std::to_string(r.caption.size()) + " bytes cut to " + std::to_string(cut) +
                " (max-caption-bytes=" + std::to_string(max_caption_bytes_) + ")";
    r.caption.resize(cut);
    r.caption.shrink_to_fit();
  }
  if (path.empty()) {
    r.error = "empty path";
    return r;
  }
  if (g_path_is_absolute(path.c_str())) {
    r.path = std::move(path);
  } else {
    gchar *p = g_build_filename(base_.c_str(), path.c_str(), nullptr);
    r.path = p;
    g_free(p);
  }
  return r;
}

const std::string &Manifest::description() const { return description_; }
const std::vector<std::string> &Manifest::warnings() const { return warnings_; }

size_t Manifest::index_bytes() const {
  return offsets_.capacity() * sizeof(uint64_t) + prompt_offsets_.capacity() * sizeof(uint64_t) +
         row_numbers_.capacity() * sizeof(uint32_t) + sizes_.capacity() * sizeof(VideoSize);
}

}  // namespace videotrain
