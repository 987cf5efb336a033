/* The latent cache's store: entries round-trip; a flipped byte, a truncated or foreign file is a
 * corrupt miss with the reason; read-only folders read; processes filling one cache at once and a
 * writer killed with SIGKILL mid-write never leave an entry that reads wrong; videotrain-cache
 * stats, verify and prune. */
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "crc32.h"
#include "latent_store.h"
#include "test_util.h"

using namespace videotrain;
namespace fs = std::filesystem;

namespace {

CacheEntry entry_of(size_t n, char fill) {
  CacheEntry e;
  CachedTensor t;
  t.name = "moments";
  t.dtype = "float32";
  t.shape = {2, static_cast<int64_t>(n)};
  t.bytes.assign(n * 2 * 4, fill);
  e.tensors.push_back(t);
  e.info = "test";
  return e;
}

std::string key_of(int i) { return sha256_hex("key " + std::to_string(i)); }

std::string run(const std::string &cmd) {
  std::string out;
  FILE *p = popen(cmd.c_str(), "r");
  char buf[512];
  while (p && fgets(buf, sizeof buf, p)) out += buf;
  if (p) pclose(p);
  return out;
}

}  // namespace

TEST(LatentStore, EntriesRoundTripAndDamageIsACorruptMiss) {
  vttest::TempDir dir;
  std::string why;
  auto s = LatentStore::open(dir.file("cache"), true, &why);
  ASSERT_TRUE(s) << why;
  CacheEntry got;
  EXPECT_EQ(s->get(key_of(1), &got, &why), LatentStore::Lookup::kMiss);
  CacheEntry e = entry_of(1000, 'a');
  CachedTensor mask{"text_mask", "int64", {3}, std::string(24, '\1')};
  e.tensors.push_back(mask);
  ASSERT_TRUE(s->put(key_of(1), e, &why)) << why;
  ASSERT_EQ(s->get(key_of(1), &got, &why), LatentStore::Lookup::kHit) << why;
  ASSERT_EQ(got.tensors.size(), 2u);
  EXPECT_EQ(got.tensors[0].bytes, e.tensors[0].bytes);
  EXPECT_EQ(got.tensors[0].shape, e.tensors[0].shape);
  ASSERT_NE(got.find("text_mask"), nullptr);
  EXPECT_EQ(got.find("text_mask")->bytes, mask.bytes);
  EXPECT_TRUE(s->contains(key_of(1)));

  const std::string path = s->entry_path(key_of(1));
  {  // one byte of the payload flipped
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-10, std::ios::end);
    f.put('z');
  }
  EXPECT_EQ(s->get(key_of(1), &got, &why), LatentStore::Lookup::kCorrupt);
  EXPECT_NE(why.find("checksum"), std::string::npos) << why;
  ASSERT_TRUE(s->put(key_of(1), e, &why)) << why;  // rewritten
  EXPECT_EQ(s->get(key_of(1), &got, &why), LatentStore::Lookup::kHit);
  fs::resize_file(path, fs::file_size(path) - 100);  // truncated
  EXPECT_EQ(s->get(key_of(1), &got, &why), LatentStore::Lookup::kCorrupt);
  EXPECT_NE(why.find("truncated"), std::string::npos) << why;
  vttest::write_file(path, "not an entry");
  EXPECT_EQ(s->get(key_of(1), &got, &why), LatentStore::Lookup::kCorrupt);
}

TEST(LatentStore, ReadOnlyFolderReadsAndRefusesWrites) {
  vttest::TempDir dir;
  std::string why;
  {
    auto s = LatentStore::open(dir.file("c"), true, &why);
    ASSERT_TRUE(s->put(key_of(2), entry_of(10, 'b'), &why)) << why;
  }
  ASSERT_EQ(std::system(("chmod -R a-w " + dir.file("c")).c_str()), 0);
  if (::geteuid() != 0) {  // root writes anyway: only the refusal of a writable open is checked there
    std::string w;
    EXPECT_FALSE(LatentStore::open(dir.file("c"), true, &w));
    EXPECT_NE(w.find("cache-mode=read"), std::string::npos) << w;
  }
  auto r = LatentStore::open(dir.file("c"), false, &why);
  ASSERT_TRUE(r) << why;
  CacheEntry got;
  EXPECT_EQ(r->get(key_of(2), &got, &why), LatentStore::Lookup::kHit);
  EXPECT_FALSE(r->put(key_of(3), entry_of(10, 'c'), &why));
  EXPECT_FALSE(LatentStore::open(dir.file("missing"), false, &why));
  std::system(("chmod -R u+w " + dir.file("c")).c_str());
}

TEST(LatentStore, ConcurrentWritersAndAKilledWriterLeaveOnlyWholeEntries) {
  vttest::TempDir dir;
  const std::string root = dir.file("cache");
  std::string why;
  ASSERT_TRUE(LatentStore::open(root, true, &why)) << why;
  // Three processes fill the same 60 keys (same bytes per key, as ranks do) plus their own.
  std::vector<pid_t> kids;
  for (int p = 0; p < 3; p++) {
    pid_t pid = fork();
    if (pid == 0) {
      std::string w;
      auto s = LatentStore::open(root, true, &w);
      for (int i = 0; i < 60; i++) s->put(key_of(i), entry_of(2000 + i, static_cast<char>('a' + i % 26)), &w);
      for (int i = 0; i < 20; i++) s->put(key_of(1000 * (p + 1) + i), entry_of(100, 'x'), &w);
      _exit(0);
    }
    kids.push_back(pid);
  }
  // A writer of large entries killed mid-way.
  pid_t victim = fork();
  if (victim == 0) {
    std::string w;
    auto s = LatentStore::open(root, true, &w);
    for (int i = 0; i < 100000; i++) s->put(key_of(5000 + i), entry_of(1 << 20, 'k'), &w);
    _exit(0);
  }
  // Killed once its first entry is in, in the middle of the ones after.
  {
    auto probe = LatentStore::open(root, false, &why);
    for (int i = 0; i < 2000 && !probe->contains(key_of(5000)); i++) usleep(5000);
    usleep(20 * 1000);
  }
  kill(victim, SIGKILL);
  for (pid_t k : kids) {
    int st = 0;
    waitpid(k, &st, 0);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  waitpid(victim, nullptr, 0);
  auto s = LatentStore::open(root, true, &why);
  CacheEntry got;
  for (int i = 0; i < 60; i++) {
    ASSERT_EQ(s->get(key_of(i), &got, &why), LatentStore::Lookup::kHit) << i << " " << why;
    EXPECT_EQ(got.tensors[0].bytes, entry_of(2000 + i, static_cast<char>('a' + i % 26)).tensors[0].bytes);
  }
  size_t whole = 0, temporary = 0;
  for (const auto &f : s->list()) {
    if (f.temporary) {
      temporary++;
      continue;
    }
    EXPECT_EQ(LatentStore::verify_file(f.path), "") << f.path;
    whole++;
  }
  EXPECT_GE(whole, 60u + 60u + 1u);  // shared, own, and at least one of the killed writer's
  EXPECT_LE(temporary, 1u);          // at most the entry in flight

  // The tool: stats, verify (a damaged entry found and removed), prune to a byte budget.
  const std::string tool = vttest::env_or("VIDEOTRAIN_BUILD_DIR", ".") + "/tools/videotrain-cache";
  std::string out = run(tool + " stats " + root);
  EXPECT_NE(out.find("entries " + std::to_string(whole)), std::string::npos) << out;
  vttest::write_file(s->entry_path(key_of(7)), "damaged");
  out = run(tool + " verify " + root + " --remove");
  EXPECT_NE(out.find(", 1 bad"), std::string::npos) << out;
  EXPECT_EQ(s->get(key_of(7), &got, &why), LatentStore::Lookup::kMiss);
  out = run(tool + " prune " + root + " --max-bytes 1M");
  EXPECT_NE(out.find("removed"), std::string::npos) << out;
  uint64_t left = 0;
  for (const auto &f : s->list()) left += f.temporary ? 0 : f.bytes;
  EXPECT_LE(left, 1u << 20);
}

namespace {

// An entry file's bytes from a header written by hand (any JSON), with a valid checksum.
std::string raw_entry(const std::string &header, const std::string &payload) {
  auto le = [](std::string &s, uint64_t v, int n) {
    for (int i = 0; i < n; i++) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  std::string out = "VTCACHE2";
  le(out, header.size(), 4);
  le(out, crc32_update(crc32_update(0, header.data(), header.size()), payload.data(), payload.size()), 4);
  le(out, payload.size(), 8);
  return out + header + payload;
}

long rss_kb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

const std::vector<TensorSpec> kMoments = {{"moments", "float32", {2, 1000}}};

}  // namespace

// Entries bound to their key and to what the reader expects: swapped, permuted, retyped and
// NaN entries are corrupt misses with the reason (then rewritten), and verify names them.
TEST(LatentStore, EntriesAreBoundToTheirKeyShapeDtypeAndFiniteValues) {
  vttest::TempDir dir;
  std::string why;
  auto s = LatentStore::open(dir.file("cache"), true, &why);
  ASSERT_TRUE(s) << why;
  CacheEntry a = entry_of(1000, 'a'), b = entry_of(1000, 'b'), got;
  a.expect = b.expect = kMoments;
  ASSERT_TRUE(s->put(key_of(1), a, &why) && s->put(key_of(2), b, &why)) << why;
  ASSERT_EQ(s->get(key_of(1), &got, &why, &kMoments), LatentStore::Lookup::kHit) << why;
  EXPECT_EQ(got.key, key_of(1));
  // Swapped between their keys: both whole, both written for the other key.
  const std::string pa = s->entry_path(key_of(1)), pb = s->entry_path(key_of(2));
  fs::rename(pa, dir.file("t"));
  fs::rename(pb, pa);
  fs::rename(dir.file("t"), pb);
  EXPECT_EQ(s->get(key_of(1), &got, &why, &kMoments), LatentStore::Lookup::kCorrupt);
  EXPECT_NE(why.find("another key"), std::string::npos) << why;
  EXPECT_NE(LatentStore::verify_file(pa).find("another key"), std::string::npos);
  EXPECT_NE(LatentStore::verify_file(pb).find("another key"), std::string::npos);
  ASSERT_TRUE(s->put(key_of(1), a, &why));  // rewritten: a hit again
  EXPECT_EQ(s->get(key_of(1), &got, &why, &kMoments), LatentStore::Lookup::kHit) << why;

  // A permuted shape (same bytes, valid checksum): the reader's expectation refuses it, and verify
  // the writer's.
  CacheEntry p = a;
  p.tensors[0].shape = {1000, 2};
  vttest::write_file(pa, encode_cache_entry(p, key_of(1)));
  EXPECT_EQ(s->get(key_of(1), &got, &why, &kMoments), LatentStore::Lookup::kCorrupt);
  EXPECT_NE(why.find("expected float32 [2, 1000]"), std::string::npos) << why;
  EXPECT_NE(LatentStore::verify_file(pa).find("expected"), std::string::npos);
  // Another dtype with the same byte count.
  CacheEntry r = a;
  r.tensors[0].dtype = "bfloat16";
  r.tensors[0].shape = {2, 2000};
  vttest::write_file(pa, encode_cache_entry(r, key_of(1)));
  EXPECT_EQ(s->get(key_of(1), &got, &why, &kMoments), LatentStore::Lookup::kCorrupt);
  EXPECT_NE(why.find("bfloat16"), std::string::npos) << why;
  // A NaN among the moments (and an infinity in a bfloat16 tensor).
  CacheEntry n = a;
  const uint32_t nan = 0x7fc00000u;
  std::memcpy(&n.tensors[0].bytes[4 * 1234], &nan, 4);
  vttest::write_file(pa, encode_cache_entry(n, key_of(1)));
  EXPECT_EQ(s->get(key_of(1), &got, &why, &kMoments), LatentStore::Lookup::kCorrupt);
  EXPECT_NE(why.find("non-finite value (element 1234)"), std::string::npos) << why;
  EXPECT_NE(LatentStore::verify_file(pa).find("non-finite"), std::string::npos);
  CacheEntry inf;
  inf.tensors = {{"e", "bfloat16", {3}, std::string("\0\0\x80\x7f\0\0", 6)}};
  EXPECT_FALSE(decode_cache_entry(encode_cache_entry(inf, ""), &got, &why));
  EXPECT_NE(why.find("non-finite"), std::string::npos) << why;
  ASSERT_TRUE(s->put(key_of(1), a, &why));
  EXPECT_EQ(s->get(key_of(1), &got, &why, &kMoments), LatentStore::Lookup::kHit) << why;
  EXPECT_EQ(got.tensors[0].bytes, a.tensors[0].bytes);
}

// Files that are not entries cost neither time nor memory: a FIFO, a /dev/zero symlink, a 1 GB
// sparse file, a header declaring 16 TB (as its shape or its payload).
TEST(LatentStore, HostileFilesAreRefusedWithoutBlockingOrAllocating) {
  vttest::TempDir dir;
  std::string why;
  auto s = LatentStore::open(dir.file("cache"), true, &why);
  ASSERT_TRUE(s) << why;
  ASSERT_TRUE(s->put(key_of(1), entry_of(10, 'a'), &why)) << why;
  const std::string path = s->entry_path(key_of(1));
  CacheEntry got;
  const long base = rss_kb();

  fs::remove(path);
  ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0);
  EXPECT_EQ(s->get(key_of(1), &got, &why), LatentStore::Lookup::kCorrupt);  // before the fix: blocks
  EXPECT_NE(why.find("not a regular file (a FIFO)"), std::string::npos) << why;
  EXPECT_NE(LatentStore::verify_file(path).find("not a regular file"), std::string::npos);
  bool listed = false;
  for (const auto &f : s->list()) listed |= f.path == path;
  EXPECT_TRUE(listed) << "verify and prune see a FIFO where an entry belongs";
  ASSERT_TRUE(s->put(key_of(1), entry_of(10, 'a'), &why)) << why;  // replaces it
  EXPECT_EQ(s->get(key_of(1), &got, &why), LatentStore::Lookup::kHit) << why;

  fs::remove(path);
  fs::create_symlink("/dev/zero", path);
  EXPECT_EQ(s->get(key_of(1), &got, &why), LatentStore::Lookup::kCorrupt);
  EXPECT_NE(why.find("not a regular file (a character device)"), std::string::npos) << why;
  EXPECT_NE(LatentStore::verify_file(path).find("not a regular file"), std::string::npos);

  fs::remove(path);
  {  // 1 GB of holes
    std::ofstream f(path, std::ios::binary);
  }
  fs::resize_file(path, 1ull << 30);
  EXPECT_EQ(s->get(key_of(1), &got, &why), LatentStore::Lookup::kCorrupt);
  EXPECT_NE(why.find("not a cache entry (1073741824 bytes"), std::string::npos) << why;
  EXPECT_NE(LatentStore::verify_file(path), "");
  // A whole-looking header for a 1 GB payload: refused by the expectation before any payload is read.
  const std::string big = "{\"key\":\"" + key_of(1) +
                          "\",\"tensors\":[{\"name\":\"moments\",\"dtype\":\"float32\",\"shape\":[268435456],"
                          "\"offset\":0,\"size\":1073741824}]}";
  std::string head = raw_entry(big, "");
  head.replace(16, 8, std::string("\0\0\0\x40\0\0\0\0", 8));  // payload length 2^30
  vttest::write_file(path, head);
  fs::resize_file(path, head.size() + (1ull << 30));
  EXPECT_EQ(s->get(key_of(1), &got, &why, &kMoments), LatentStore::Lookup::kCorrupt);
  EXPECT_NE(why.find("expected float32 [2, 1000]"), std::string::npos) << why;
  EXPECT_NE(LatentStore::verify_file(path).find("checksum"), std::string::npos);  // streamed through
  EXPECT_LT(rss_kb() - base, 16 * 1024) << "kB over the baseline after reading the hostile files";

  // 16 TB declared: as a shape over a small payload, and as a payload the file does not hold.
  const std::string payload(80, '\0');
  vttest::write_file(path, raw_entry("{\"key\":\"" + key_of(1) +
                                         "\",\"tensors\":[{\"name\":\"moments\",\"dtype\":\"float32\",\"shape\":"
                                         "[1048576,1048576,4],\"offset\":0,\"size\":80}]}",
                                     payload));
  EXPECT_EQ(s->get(key_of(1), &got, &why), LatentStore::Lookup::kCorrupt);
  EXPECT_NE(why.find("holds 80 bytes, not 17592186044416"), std::string::npos) << why;
  std::string huge = raw_entry("{\"key\":\"" + key_of(1) + "\",\"tensors\":[]}", payload);
  huge.replace(16, 8, std::string("\0\0\0\0\0\x10\0\0", 8));
  vttest::write_file(path, huge);
  EXPECT_EQ(s->get(key_of(1), &got, &why), LatentStore::Lookup::kCorrupt);
  EXPECT_NE(why.find("truncated or overwritten"), std::string::npos) << why;
  // Old-format entries are misses under v2/ (the folder changed), and named when met.
  std::string old = encode_cache_entry(entry_of(10, 'a'), key_of(1));
  old[7] = '1';
  vttest::write_file(path, old);
  EXPECT_EQ(s->get(key_of(1), &got, &why), LatentStore::Lookup::kCorrupt);
  EXPECT_NE(why.find("older VTCACHE1"), std::string::npos) << why;
  EXPECT_NE(path.find("/v2/"), std::string::npos) << path;
}
