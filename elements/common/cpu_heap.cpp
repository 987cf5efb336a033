#include "cpu_heap.h"

#include <mutex>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace videotrain {

bool retain_cpu_heap(std::string *why, std::size_t mmap_threshold, std::size_t trim_threshold) {
#if defined(__GLIBC__)
  static std::mutex mu;
  static bool done = false;
  std::lock_guard<std::mutex> lock(mu);
  if (done) return true;
  // Setting either one turns off glibc's own threshold adjustment, so both are set.
  // glibc caps the mmap threshold at 32 MiB on 64-bit (HEAP_MAX_SIZE / 2).
  if (mallopt(M_MMAP_THRESHOLD, static_cast<int>(mmap_threshold)) != 1 ||
      mallopt(M_TRIM_THRESHOLD, static_cast<int>(trim_threshold)) != 1) {
    if (why) *why = "mallopt refused the thresholds";
    return false;
  }
  done = true;
  return true;
#else
  (void)mmap_threshold;
  (void)trim_threshold;
  if (why) *why = "not glibc: the C heap is left as it is";
  return false;
#endif
}

bool retain_large_cpu_blocks(std::string *why) {
#if defined(__GLIBC__)
  if (!retain_cpu_heap(why)) return false;
  if (mallopt(M_MMAP_MAX, 0) != 1) {
    if (why) *why = "mallopt refused M_MMAP_MAX";
    return false;
  }
  return true;
#else
  if (why) *why = "not glibc: the C heap is left as it is";
  return false;
#endif
}

}  // namespace videotrain
