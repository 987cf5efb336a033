/* Non-blocking opens of regular files: see regular_file.h. */
#include "regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace videotrain {

namespace {

const char *kind_of(mode_t m) {
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISDIR(m)) return "a folder";
  return "not a file";
}

}  // namespace

RegularFile &RegularFile::operator=(RegularFile &&o) noexcept {
  if (this != &o) {
    close();
    fd_ = o.fd_;
    size_ = o.size_;
    o.fd_ = -1;
  }
  return *this;
}

RegularFile::~RegularFile() { close(); }

void RegularFile::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  size_ = 0;
}

bool RegularFile::open(const std::string &path, std::string *why, bool *missing) {
  close();
  if (missing) *missing = false;
  // O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    const int e = errno;
    if (missing) *missing = e == ENOENT;
    // A socket cannot be opened at all (ENXIO): name it the way the other kinds are named.
    struct stat st {};
    if (e == ENXIO && ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
      *why = path + ": not a regular file (" + kind_of(st.st_mode) + ")";
    } else {
      *why = path + ": " + std::strerror(e);
    }
    return false;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    *why = path + ": cannot stat: " + std::strerror(errno);
    ::close(fd);
    return false;
  }
  if (!S_ISREG(st.st_mode)) {
    *why = path + ": not a regular file (" + kind_of(st.st_mode) + ")";
    ::close(fd);
    return false;
  }
  // Regular files ignore O_NONBLOCK; cleared anyway so that reads mean what they say.
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  fd_ = fd;
  size_ = static_cast<uint64_t>(st.st_size);
  return true;
}

bool RegularFile::read_at(uint64_t offset, void *buf, size_t n, std::string *why) const {
  auto *p = static_cast<char *>(buf);
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd_, p + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      *why = std::string("read failed: ") + std::strerror(errno);
      return false;
    }
    if (r == 0) {
      *why = "the file ends after " + std::to_string(offset + done) + " bytes (it shrank while being read)";
      return false;
    }
    done += static_cast<size_t>(r);
  }
  return true;
}

bool read_small_file(const std::string &path, uint64_t max_bytes, std::string *out, std::string *why) {
  RegularFile f;
  if (!f.open(path, why)) return false;
  if (f.size() > max_bytes) {
    *why = path + ": " + std::to_string(f.size()) + " bytes, more than the " + std::to_string(max_bytes) +
           " such a file may hold";
    return false;
  }
  std::string bytes(static_cast<size_t>(f.size()), '\0');
  std::string err;
  if (!f.read_at(0, bytes.data(), bytes.size(), &err)) {
    *why = path + ": " + err;
    return false;
  }
  *out = std::move(bytes);
  return true;
}

}  // namespace videotrain
