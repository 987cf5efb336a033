/* Opening the files the project reads (cache entries, manifests, configs, weights) so that a
 * hostile or mistaken path cannot hang or exhaust the process: the open never blocks (a FIFO
 * without a writer would block forever, and stopping joins the thread), anything but a regular
 * file (FIFO, device such as a /dev/zero symlink, socket, folder) is refused as "not a regular
 * file", and the caller gets the file's size to check declared lengths against before it reads
 * or allocates anything. No torch, no GStreamer. */
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace videotrain {

// An open, regular, read-only file and its size; closes itself.
class RegularFile {
 public:
  RegularFile() = default;
  RegularFile(const RegularFile &) = delete;
  RegularFile &operator=(const RegularFile &) = delete;
  RegularFile(RegularFile &&o) noexcept : fd_(o.fd_), size_(o.size_) { o.fd_ = -1; }
  RegularFile &operator=(RegularFile &&o) noexcept;
  ~RegularFile();

  // False with *why ("<path>: not a regular file (a FIFO)", "<path>: No such file or directory");
  // *missing (when given) tells a file that does not exist from one that cannot be used.
  bool open(const std::string &path, std::string *why, bool *missing = nullptr);
  int fd() const { return fd_; }
  uint64_t size() const { return size_; }
  // Reads exactly n bytes at offset (retrying short reads and EINTR); false with *why when the
  // file ends early or a read fails.
  bool read_at(uint64_t offset, void *buf, size_t n, std::string *why) const;
  void close();
  // The descriptor, now the caller's to close.
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
  uint64_t size_ = 0;
};

// What a config (config.json, an index JSON) may weigh: far above any real one.
constexpr uint64_t kMaxConfigBytes = 16u << 20;

// A whole small file (a config, a JSON index, a list): refused when it is not a regular file or
// larger than max_bytes (so a multi-gigabyte file given as a config does not fill memory).
bool read_small_file(const std::string &path, uint64_t max_bytes, std::string *out, std::string *why);

}  // namespace videotrain
