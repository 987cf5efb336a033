/* Manifest indexing against loading, measured in one run.
 *
 *   build/bench/manifest-index [rows=1000000] [caption-bytes=160]
 *
 * Writes an Open-Sora style CSV (path,text,num_frames,height,width,aspect_ratio,resolution,fps;
 * every 5th caption quoted with commas and doubled quotes, every 50th spanning two lines), then:
 *  1. Manifest::open: seconds to index, index_bytes() per row and resident bytes per row
 *     (VmRSS growth, so allocator slack counts too). Target: a few seconds, <= 16 bytes a row.
 *  2. The peer: what a loader that keeps every row does (a vector of {path, caption} strings,
 *     parsed with the same RFC 4180 rules), same file, same process. Ratios are printed.
 *  3. row(): microseconds per random row, one thread and two threads.
 *  4. Buckets: start-up with the size columns kept (16 bytes a row more), every row put in its
 *     size and frame bucket, and the first epoch's step groups built: what csvvideosrc buckets=
 *     frame-buckets= does before its first clip. Target: under a second for 1M rows. The peer's
 *     load above also parses the three size columns.
 * The file comes from the page cache (it was just written): this measures the scan, not the disk. */
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "csvvideosrc/bucket_rows.h"
#include "csvvideosrc/manifest.h"

using videotrain::Manifest;
using videotrain::ManifestOptions;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

long rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6) * 1024;
  return 0;
}

std::string make_csv(const std::string &path, size_t rows, size_t caption_bytes) {
  std::FILE *f = std::fopen(path.c_str(), "wb");
  if (!f) {
    std::perror(path.c_str());
    std::exit(1);
  }
  std::fputs("path,text,num_frames,height,width,aspect_ratio,resolution,fps\n", f);
  std::string filler;
  const char *words[] = {"a ", "slow ", "pan ", "over ", "the ", "city ", "at ", "dusk ", "with ", "lights "};
  for (size_t i = 0; filler.size() < caption_bytes; i++) filler += words[i % 10];
  filler.resize(caption_bytes);
  std::string line;
  for (size_t i = 0; i < rows; i++) {
    line = "videos/part" + std::to_string(i % 100) + "/clip_" + std::to_string(i) + ".mp4,";
    if (i % 50 == 0)
      line += "\"two\nlines, " + filler + "\"";
    else if (i % 5 == 0)
      line += "\"a \"\"quoted\"\", " + filler + "\"";
    else
      line += filler;
    static const char *sizes[] = {"480,720", "720,720", "720,480", "405,720"};  // 3:2 1:1 2:3 16:9
    line += "," + std::to_string(17 + (i * 7919) % 400) + "," + sizes[i % 4] + ",0.67,480p,24\n";
    std::fwrite(line.data(), 1, line.size(), f);
  }
  std::fclose(f);
  return path;
}

// The peer: every row's path and caption kept in memory (what loading the manifest costs).
struct Loaded {
  std::vector<std::pair<std::string, std::string>> rows;
  std::vector<std::array<int, 3>> sizes;  // num_frames, height, width
};

Loaded load_all(const std::string &path) {
  Loaded l;
  std::ifstream f(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  size_t pos = 0;
  videotrain::parse_csv_record(text, 0, &pos);  // header
  while (pos < text.size()) {
    auto fields = videotrain::parse_csv_record(text, pos, &pos);
    if (fields.size() >= 5) {
      l.rows.emplace_back(std::move(fields[0]), std::move(fields[1]));
      l.sizes.push_back({std::atoi(fields[2].c_str()), std::atoi(fields[3].c_str()), std::atoi(fields[4].c_str())});
    }
  }
  l.rows.shrink_to_fit();
  l.sizes.shrink_to_fit();
  return l;
}

}  // namespace

int main(int argc, char **argv) {
  const size_t rows = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1000000;
  const size_t caption_bytes = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 160;
  char tmpl[] = "/tmp/manifest-bench-XXXXXX";
  if (!mkdtemp(tmpl)) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string dir = tmpl, csv = dir + "/train.csv";
  double t = now();
  make_csv(csv, rows, caption_bytes);
  std::FILE *sz = std::fopen(csv.c_str(), "rb");
  std::fseek(sz, 0, SEEK_END);
  const long file_bytes = std::ftell(sz);
  std::fclose(sz);
  std::printf("manifest: %zu rows, %.1f MB, written in %.2f s\n", rows, file_bytes / 1e6, now() - t);

  // 1. Index.
  ManifestOptions o;
  o.location = csv;
  std::string err;
  long rss0 = rss_bytes();
  t = now();
  auto m = Manifest::open(o, &err);
  const double index_s = now() - t;
  const long index_rss = rss_bytes() - rss0;
  if (!m || m->size() != rows) {
    std::fprintf(stderr, "open failed or wrong size: %s (%zu rows)\n", err.c_str(), m ? m->size() : 0);
    return 1;
  }
  std::printf("index:  %.3f s (%.0f MB/s), index_bytes %.2f B/row, resident +%.2f B/row  [%s]\n", index_s,
              file_bytes / 1e6 / index_s, double(m->index_bytes()) / rows, double(index_rss) / rows,
              m->description().c_str());

  // 3. Random rows (before the peer, so its memory does not disturb the page cache).
  const size_t probes = std::min<size_t>(rows, 200000);
  std::mt19937_64 rng(7);
  std::vector<size_t> picks(probes);
  for (auto &p : picks) p = rng() % rows;
  std::atomic<size_t> bad{0};
  auto read = [&](size_t from, size_t step) {
    for (size_t k = from; k < probes; k += step) {
      auto r = m->row(picks[k]);
      if (!r.error.empty() || r.row != picks[k] ||
          r.path.size() < 4 || r.path.compare(r.path.size() - 4, 4, ".mp4") != 0)
        bad++;
    }
  };
  t = now();
  read(0, 1);
  const double one = now() - t;
  t = now();
  std::thread a(read, 0, 2), b(read, 1, 2);
  a.join();
  b.join();
  const double two = now() - t;
  std::printf("row():  %.2f us/row (1 thread), %.2f us/row wall (2 threads), %zu bad\n", one / probes * 1e6,
              two / probes * 1e6, bad.load());

  // 4. Buckets: index with sizes, assign, plan the first epoch.
  m.reset();
  ManifestOptions ob = o;
  ob.sizes = true;
  videotrain::BucketSpec spec;
  std::string why;
  videotrain::parse_size_buckets("720x480,640x640,480x720,848x480", &spec.sizes, &why);
  videotrain::parse_frame_buckets("49,33,17", &spec.frames, &why);
  rss0 = rss_bytes();
  t = now();
  auto mb = Manifest::open(ob, &err);
  const double sized_s = now() - t;
  videotrain::BucketAssignment asg;
  if (!mb || !videotrain::assign_buckets(*mb, spec, 1, nullptr, &asg, &err)) {
    std::fprintf(stderr, "buckets failed: %s\n", err.c_str());
    return 1;
  }
  const double assign_s = now() - t - sized_s;
  videotrain::BucketSchedule sched(asg.row_bucket, spec.count(), 0, 8, true, 1, 8);
  const uint64_t clips = sched.clips_in_epoch(0);
  const double bucket_start_s = now() - t;
  const long bucket_rss = rss_bytes() - rss0;
  std::printf("buckets: start %.3f s (index with sizes %.3f s, assign %.3f s, first epoch's groups %.3f s), "
              "resident +%.1f B/row, %llu probed, %llu left out; rank 0 of 8: %llu steps, %llu clips\n",
              bucket_start_s, sized_s, assign_s, bucket_start_s - sized_s - assign_s, double(bucket_rss) / rows,
              (unsigned long long)asg.probed, (unsigned long long)(asg.too_short + asg.unreadable),
              (unsigned long long)sched.steps_per_epoch(), (unsigned long long)clips);
  mb.reset();

  // 2. The peer.
  long rss1 = rss_bytes();
  t = now();
  Loaded l = load_all(csv);
  const double load_s = now() - t;
  const long load_rss = rss_bytes() - rss1;
  std::printf("peer (load all rows): %.3f s, resident +%.1f B/row (%zu rows)\n", load_s, double(load_rss) / rows,
              l.rows.size());
  std::printf("ratio: index time %.2fx of loading, index memory %.3fx of loading (%.0fx smaller)\n",
              index_s / load_s, double(index_rss) / double(load_rss), double(load_rss) / double(index_rss));
  std::printf("ratio: bucketed start-up %.2fx the peer's load time (the peer has no buckets yet), memory %.3fx\n",
              bucket_start_s / load_s, double(bucket_rss) / double(load_rss));

  std::remove(csv.c_str());
  rmdir(dir.c_str());
  return bad.load() == 0 && l.rows.size() == rows ? 0 : 1;
}
