/* Fuzz inputs as files: the parsers read paths (open, pread, mmap), so each input goes
 * into an anonymous memory file reached through /proc/self/fd, not onto the disk. */
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace fuzzin {

class MemFile {
 public:
  MemFile(const uint8_t *data, size_t size) {
    fd_ = memfd_create("fuzz-input", MFD_CLOEXEC);
    if (fd_ < 0) abort();
    for (size_t done = 0; done < size;) {
      ssize_t n = write(fd_, data + done, size - done);
      if (n <= 0) abort();
      done += size_t(n);
    }
  }
  ~MemFile() { close(fd_); }
  MemFile(const MemFile &) = delete;
  MemFile &operator=(const MemFile &) = delete;
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_ = -1;
};

// A broken invariant: crash so that libFuzzer (or the corpus runner) reports the input.
inline void check(bool ok) {
  if (!ok) abort();
}

}  // namespace fuzzin
