/* The manifest of a training run, indexed, not loaded.
 *
 * A CSV file (RFC 4180, header row) or a CogVideo folder (videos.txt + prompts.txt).
 * Opening scans the file once and keeps the byte offset of every record (8 bytes a
 * row, plus 4 for the row number when a split filter drops rows; 16 for a folder);
 * paths and captions are read from disk (pread) when a row is asked for.
 * Blank lines are not rows, in both layouts (as CogVideo's loader skips them). */
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace videotrain {

struct ManifestOptions {
  std::string location;        // CSV file or CogVideo folder
  std::string root;            // base for relative paths; empty = the CSV's folder
  std::string path_column;     // override; empty = auto
  std::string caption_column;  // override; empty = auto
  std::string split;           // keep only rows whose split column equals this; empty = all
  bool sizes = false;          // keep each row's num_frames, height, width and fps columns (buckets)
  size_t max_caption_bytes = 16384;  // longer captions are cut (at a UTF-8 boundary) with a warning
};

// A video's size as the manifest gives it (Open-Sora columns; videotrain-probe writes them).
// 0 = unknown. 16 bytes a row, kept only when ManifestOptions::sizes is set.
struct VideoSize {
  uint32_t frames = 0;
  uint32_t width = 0, height = 0;
  float fps = 0;
  bool known_shape() const { return width > 0 && height > 0; }
};

struct ManifestRow {
  uint64_t row = 0;     // 0-based data row number in the file (before split filtering)
  std::string path;     // resolved against root
  std::string caption;
  std::string split;
  double fps = 0;       // the video's frame rate from an `fps` column (Open-Sora); 0 = none
  std::string error;    // non-empty: row unusable (missing path, bad UTF-8, ...)
  std::string warning;  // non-empty: the row is used, changed (a caption cut to max_caption_bytes)
};

class Manifest {
 public:
  static std::unique_ptr<Manifest> open(const ManifestOptions &opts, std::string *error);
  ~Manifest();
  Manifest(const Manifest &) = delete;
  Manifest &operator=(const Manifest &) = delete;

  size_t size() const;                  // rows after split filtering
  ManifestRow row(size_t index) const;  // index in [0, size()); thread-safe; reads from disk
  const std::string &description() const;
  // What a reader should be told once, at start: no caption column, a quote that never closes.
  const std::vector<std::string> &warnings() const;
  size_t index_bytes() const;           // bytes held by the index
  // Sizes (ManifestOptions::sizes): from the columns, or set after probing. Thread-safe.
  VideoSize video_size(size_t index) const;
  void set_video_size(size_t index, const VideoSize &size);

 private:
  Manifest() = default;
  bool open_csv(const ManifestOptions &opts, std::string *error);
  bool open_folder(const ManifestOptions &opts, std::string *error);
  bool read_header(const std::string &loc, std::vector<std::string> *header, uint64_t *data_at, std::string *error);
  bool resolve_columns(const ManifestOptions &opts, const std::vector<std::string> &header, std::string *error);
  // One record (CSV) or line (folder) starting at `offset` of file `fd`; false and
  // *error when it cannot be read or is too long.
  bool read_record(int fd, uint64_t offset, bool csv, std::vector<std::string> *fields, std::string *error) const;

  bool csv_ = true;
  int fd_ = -1, prompts_fd_ = -1;
  std::string base_;                // folder relative paths resolve against
  int path_col_ = -1, caption_col_ = -1, split_col_ = -1, fps_col_ = -1;
  size_t max_caption_bytes_ = 16384;
  int frames_col_ = -1, height_col_ = -1, width_col_ = -1;
  std::string size_columns_description() const;
  std::vector<uint64_t> offsets_;   // record starts (CSV or videos.txt)
  std::vector<uint64_t> prompt_offsets_;  // prompts.txt line starts (folder layout)
  std::vector<uint32_t> row_numbers_;     // only when a split filter dropped rows
  std::vector<VideoSize> sizes_;          // by index, only with ManifestOptions::sizes
  mutable std::mutex sizes_lock_;
  uint64_t unterminated_at_ = UINT64_MAX;  // start of a record whose quote never closes
  std::string description_;
  std::vector<std::string> warnings_;
  uint64_t unterminated_row_ = 0;
};

// RFC 4180 fields of one record in `text` starting at `pos`; sets *end past the
// record's terminator. Exposed for tests.
std::vector<std::string> parse_csv_record(const std::string &text, size_t pos, size_t *end);

}  // namespace videotrain
