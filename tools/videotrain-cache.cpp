/* videotrain-cache: look after a latent cache folder (vaeencoder cache-dir=DIR).
 *
 *   videotrain-cache stats DIR                 entries, bytes, leftover temporary files
 *   videotrain-cache verify DIR [--remove]     checks every entry as a lookup would (a regular file,
 *                                              lengths, the key it was written for, its tensors'
 *                                              shapes and dtypes against what its writer expected,
 *                                              checksum, finite values), reading each in bounded
 *                                              pieces; --remove deletes bad ones
 *   videotrain-cache prune DIR [--max-bytes N[KMGT]] [--older-than D[smhd]]
 *                                              deletes entries not used for D, then the least recently
 *                                              used until the cache holds at most N bytes; temporary
 *                                              files of writers killed mid-write (older than an hour)
 * Entries are used (their modification time refreshed) at most once a day when read, so
 * --older-than and --max-bytes go by last use. Safe while pipelines run: a reader sees a whole entry
 * or a miss, and a pruned entry is encoded again. */
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "latent_store.h"

using videotrain::LatentStore;

namespace {

int usage() {
  std::fprintf(stderr,
               "usage: videotrain-cache stats DIR\n"
               "       videotrain-cache verify DIR [--remove]\n"
               "       videotrain-cache prune DIR [--max-bytes N[KMGT]] [--older-than D[smhd]]\n");
  return 2;
}

// "10G" -> bytes, "30d" -> seconds; false on anything else.
bool parse_scaled(const std::string &s, const char *units, const double *scales, double *out) {
  char *end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || v < 0) return false;
  if (*end == '\0') {
    *out = v;
    return true;
  }
  const char *u = std::strchr(units, *end);
  if (!u || end[1] != '\0') return false;
  *out = v * scales[u - units];
  return true;
}

// A value that does not parse: what is wrong, then the usage.
int bad_value(const char *option, const std::string &value, const char *expected) {
  std::fprintf(stderr, "videotrain-cache: %s '%s' is not %s\n", option, value.c_str(), expected);
  return usage();
}

std::string human(double b) {
  const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024 && i < 4) b /= 1024, i++;
  char s[32];
  std::snprintf(s, sizeof s, "%.1f %s", b, u[i]);
  return s;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc < 3) return usage();
  const std::string cmd = argv[1], dir = argv[2];
  std::string why;
  auto store = LatentStore::open(dir, false, &why);
  if (!store) {
    std::fprintf(stderr, "videotrain-cache: %s\n", why.c_str());
    return 1;
  }
  const auto files = store->list();
  if (cmd == "stats") {
    uint64_t n = 0, bytes = 0, tmp = 0;
    for (const auto &f : files) (f.temporary ? tmp : n) += 1, bytes += f.temporary ? 0 : f.bytes;
    std::printf("entries %llu\nbytes %llu (%s)\ntemporary %llu\n", static_cast<unsigned long long>(n),
                static_cast<unsigned long long>(bytes), human(static_cast<double>(bytes)).c_str(),
                static_cast<unsigned long long>(tmp));
    return 0;
  }
  if (cmd == "verify") {
    bool remove = argc > 3 && std::string(argv[3]) == "--remove";
    uint64_t good = 0, bad = 0;
    for (const auto &f : files) {
      if (f.temporary) continue;
      const std::string err = LatentStore::verify_file(f.path);
      if (err.empty()) {
        good++;
        continue;
      }
      bad++;
      std::printf("bad %s: %s%s\n", f.path.c_str(), err.c_str(), remove ? " (removed)" : "");
      if (remove) ::unlink(f.path.c_str());
    }
    std::printf("%llu entries verified, %llu bad\n", static_cast<unsigned long long>(good),
                static_cast<unsigned long long>(bad));
    return bad && !remove ? 1 : 0;
  }
  if (cmd == "prune") {
    double max_bytes = -1, older = -1;
    static const double bscale[] = {1024.0, 1048576.0, 1073741824.0, 1099511627776.0};
    static const double tscale[] = {1, 60, 3600, 86400};
    for (int i = 3; i < argc; i++) {
      const std::string a = argv[i];
      if (a == "--max-bytes" && i + 1 < argc) {
        if (!parse_scaled(argv[++i], "KMGT", bscale, &max_bytes))
          return bad_value("--max-bytes", argv[i], "a size in bytes, with an optional K, M, G or T (x1024), e.g. 10G");
      } else if (a == "--older-than" && i + 1 < argc) {
        if (!parse_scaled(argv[++i], "smhd", tscale, &older))
          return bad_value("--older-than", argv[i], "a number of seconds, with an optional s, m, h or d, e.g. 30d");
      } else {
        std::fprintf(stderr, "videotrain-cache: prune: unexpected argument '%s'%s\n", a.c_str(),
                     a == "--max-bytes" || a == "--older-than" ? " (it needs a value)" : "");
        return usage();
      }
    }
    const double now = static_cast<double>(std::time(nullptr));
    uint64_t kept_bytes = 0, removed = 0, freed = 0;
    std::vector<const LatentStore::File *> entries;
    for (const auto &f : files) {
      const double age = now - static_cast<double>(f.mtime);
      if ((f.temporary && age > 3600) || (!f.temporary && older >= 0 && age > older)) {
        if (::unlink(f.path.c_str()) == 0) removed++, freed += f.bytes;
        continue;
      }
      if (!f.temporary) entries.push_back(&f), kept_bytes += f.bytes;
    }
    for (const auto *f : entries) {  // oldest first
      if (max_bytes < 0 || static_cast<double>(kept_bytes) <= max_bytes) break;
      if (::unlink(f->path.c_str()) == 0) removed++, freed += f->bytes, kept_bytes -= f->bytes;
    }
    std::printf("removed %llu files (%s), %s left\n", static_cast<unsigned long long>(removed),
                human(static_cast<double>(freed)).c_str(), human(static_cast<double>(kept_bytes)).c_str());
    return 0;
  }
  return usage();
}
