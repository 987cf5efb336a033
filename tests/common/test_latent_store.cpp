/* The latent cache's store: entries round-trip; a flipped byte, a truncated or foreign file is a
 * corrupt miss with the reason; read-only folders read; processes filling one cache at once and a
 * writer killed with SIGKILL mid-write never leave an entry that reads wrong; videotrain-cache
 * stats, verify and prune. */
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

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
