/* videotrain-probe: fills a manifest's num_frames, height, width and fps columns.
 *
 *   videotrain-probe [-j N] [--root DIR] [--path-column NAME] IN.csv OUT.csv
 *
 * Probes each video with GstDiscoverer on N threads (default: the number of CPUs) and writes
 * a copy of IN with the four columns (added at the end when missing). A value that is there
 * and valid (a positive number) is kept; one that is 0, empty or not a number is filled, 0
 * when the video cannot be probed (with a warning). num_frames is the video stream's own
 * frame count (an MP4/MOV's sample table, else its frames counted by demuxing, not decoding),
 * not the container's duration times the rate (another track may last longer; a variable rate
 * has no one rate); fps is the stream's rate, or its mean rate when it has none. A row whose
 * four values are all valid is not probed.
 * Resumable: each probed row goes to OUT.partial as it completes; Ctrl-C stops after the
 * probes in flight, and a rerun with the same IN skips the rows OUT.partial holds. OUT is
 * written (then OUT.partial removed) when every row is done. */
#include <gst/gst.h>
#include <gst/pbutils/pbutils.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "csvvideosrc/manifest.h"
#include "video_probe.h"

using videotrain::Manifest;
using videotrain::ManifestOptions;
using videotrain::Probe;
using videotrain::probe_video;

namespace {

const char *const kColumns[] = {"num_frames", "height", "width", "fps"};
constexpr int kNumColumns = 4;

std::atomic<bool> g_stop{false};
void on_sigint(int) { g_stop = true; }

int usage() {
  std::fprintf(stderr,
               "usage: videotrain-probe [-j N] [--root DIR] [--path-column NAME] IN.csv OUT.csv\n"
               "  fills num_frames, height, width and fps (0 or empty = unknown) from the videos;\n"
               "  resumable after Ctrl-C (progress is kept in OUT.partial)\n");
  return 2;
}

std::string trim(const std::string &s) {
  size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

std::string lower(std::string s) {
  for (char &c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// A value the manifest may keep: a positive integer (num_frames, height, width) or a
// positive frame rate up to 1000 (what csvvideosrc accepts).
bool valid_value(const std::string &raw, bool fps) {
  const std::string v = trim(raw);
  if (v.empty()) return false;
  char *end = nullptr;
  const double d = g_ascii_strtod(v.c_str(), &end);
  if (!end || *end != '\0' || !std::isfinite(d) || d <= 0) return false;
  return fps ? d <= 1000 : d == std::floor(d);
}

std::string format_fps(double fps) {
  char s[32];
  g_ascii_formatd(s, sizeof s, "%.6g", fps);
  return s;
}

std::string csv_field(const std::string &f) {
  if (f.find_first_of(",\"\r\n") == std::string::npos) return f;
  std::string q = "\"";
  for (char c : f) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

std::string csv_record(const std::vector<std::string> &fields) {
  std::string line;
  for (size_t i = 0; i < fields.size(); i++) line += (i ? "," : "") + csv_field(fields[i]);
  return line + "\n";
}

// OUT.partial: a first line naming IN (path, size, modification time), then one line per
// probed row: "INDEX num_frames height width fps". A line cut short by a kill is ignored.
std::string partial_header(const std::string &in) {
  struct stat st {};
  stat(in.c_str(), &st);
  gchar *abs = g_canonicalize_filename(in.c_str(), nullptr);
  std::string h = std::string("# videotrain-probe ") + abs + " " + std::to_string(st.st_size) + " " +
                  std::to_string(st.st_mtime) + "\n";
  g_free(abs);
  return h;
}

std::map<size_t, Probe> read_partial(const std::string &path, const std::string &header) {
  std::map<size_t, Probe> done;
  std::ifstream f(path);
  std::string line;
  if (!std::getline(f, line)) return done;
  if (line + "\n" != header) {
    std::fprintf(stderr, "videotrain-probe: %s is from another manifest (or IN changed since): starting over\n",
                 path.c_str());
    return done;
  }
  std::string content((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::istringstream lines(content);
  // Only lines that end in a newline are whole.
  size_t whole = content.rfind('\n');
  size_t pos = 0;
  while (whole != std::string::npos && pos <= whole && std::getline(lines, line)) {
    pos += line.size() + 1;
    std::istringstream ls(line);
    size_t index;
    Probe p;
    std::string fps;
    if (ls >> index >> p.num_frames >> p.height >> p.width >> fps) {
      p.fps = g_ascii_strtod(fps.c_str(), nullptr);
      done[index] = p;
    }
  }
  return done;
}

}  // namespace

int main(int argc, char **argv) {
  ManifestOptions opts;
  unsigned jobs = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::string> files;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    if ((a == "-j" || a == "--jobs") && i + 1 < argc) {
      const int n = std::atoi(argv[++i]);
      if (n < 1 || n > 1024) return usage();
      jobs = unsigned(n);
    } else if (a == "--root" && i + 1 < argc) {
      opts.root = argv[++i];
    } else if (a == "--path-column" && i + 1 < argc) {
      opts.path_column = argv[++i];
    } else if (a == "-h" || a == "--help") {
      return usage();
    } else if (!a.empty() && a[0] == '-') {
      return usage();
    } else {
      files.push_back(a);
    }
  }
  if (files.size() != 2) return usage();
  const std::string in = files[0], out = files[1], partial = out + ".partial";
  gst_init(&argc, &argv);

  struct stat st {};
  if (stat(in.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    std::fprintf(stderr, "videotrain-probe: %s is a folder; only CSV manifests have size columns\n", in.c_str());
    return 1;
  }
  opts.location = in;
  std::string error;
  auto manifest = Manifest::open(opts, &error);
  if (!manifest) {
    std::fprintf(stderr, "videotrain-probe: %s\n", error.c_str());
    return 1;
  }

  // The records themselves, to copy every other column as it is: the header, then one per
  // non-blank record, which are the manifest's rows in order. The file stays in memory with
  // each record's start (8 bytes a row); records are parsed when used.
  std::ifstream f(in, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  size_t pos = text.compare(0, 3, "\xEF\xBB\xBF") == 0 ? 3 : 0;
  std::vector<size_t> starts;
  std::vector<std::string> header;
  while (pos < text.size()) {
    size_t end = pos;
    auto fields = videotrain::parse_csv_record(text, pos, &end);
    if (end <= pos) break;
    if (!trim(text.substr(pos, end - pos)).empty()) {
      if (header.empty() && starts.empty()) header = std::move(fields);
      else starts.push_back(pos);
    }
    pos = end;
  }
  if (header.empty() || starts.size() != manifest->size()) {
    std::fprintf(stderr, "videotrain-probe: %s: found %zu rows where the manifest index has %zu\n", in.c_str(),
                 starts.size(), manifest->size());
    return 1;
  }
  auto record = [&](size_t row) { return videotrain::parse_csv_record(text, starts[row], nullptr); };
  int col[kNumColumns];
  for (int c = 0; c < kNumColumns; c++) {
    col[c] = -1;
    for (size_t k = 0; k < header.size(); k++)
      if (lower(trim(header[k])) == kColumns[c]) col[c] = int(k);
    if (col[c] < 0) {
      col[c] = int(header.size());
      header.push_back(kColumns[c]);
    }
  }
  auto complete = [&](size_t row) {
    const auto r = record(row);
    for (int c = 0; c < kNumColumns; c++)
      if (size_t(col[c]) >= r.size() || !valid_value(r[size_t(col[c])], c == 3)) return false;
    return true;
  };

  // Rows to probe: those with a missing value, less what an earlier run left in OUT.partial.
  const std::string head = partial_header(in);
  std::map<size_t, Probe> results = read_partial(partial, head);
  std::vector<size_t> todo;
  for (size_t r = 0; r < manifest->size(); r++)
    if (!complete(r) && !results.count(r)) todo.push_back(r);
  const size_t resumed = results.size();
  if (resumed) std::fprintf(stderr, "videotrain-probe: resuming, %zu rows already probed in %s\n", resumed, partial.c_str());
  // Rewrite OUT.partial whole (an earlier run's torn last line goes), then append.
  FILE *pf = std::fopen(partial.c_str(), "w");
  if (!pf) {
    std::fprintf(stderr, "videotrain-probe: cannot write %s: %s\n", partial.c_str(), std::strerror(errno));
    return 1;
  }
  std::fputs(head.c_str(), pf);
  for (const auto &[r, p] : results)
    std::fprintf(pf, "%zu %lld %lld %lld %s\n", r, (long long)p.num_frames, (long long)p.height, (long long)p.width,
                 format_fps(p.fps).c_str());
  std::fflush(pf);

  std::signal(SIGINT, on_sigint);
  std::signal(SIGTERM, on_sigint);
  std::atomic<size_t> next{0};
  std::mutex lock;  // results, OUT.partial, stderr
  size_t done = 0, failed = 0;
  const auto t0 = std::chrono::steady_clock::now();
  auto last_print = t0;
  const bool tty = isatty(STDERR_FILENO);
  auto progress = [&](bool final) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "%sprobed %zu/%zu videos, %.1f videos/s%s", tty ? "\r" : "", done, todo.size(),
                 s > 0 ? done / s : 0.0, final || !tty ? "\n" : "");
  };
  auto worker = [&]() {
    GError *err = nullptr;
    GstDiscoverer *disc = gst_discoverer_new(30 * GST_SECOND, &err);
    if (!disc) {
      std::lock_guard<std::mutex> g(lock);
      std::fprintf(stderr, "videotrain-probe: cannot make a GstDiscoverer: %s\n", err ? err->message : "?");
      g_clear_error(&err);
      g_stop = true;
      return;
    }
    for (;;) {
      if (g_stop) break;
      const size_t k = next++;
      if (k >= todo.size()) break;
      const size_t r = todo[k];
      const auto row = manifest->row(r);
      Probe p;
      std::string why = row.error;
      const bool ok = why.empty() && probe_video(disc, row.path, &p, &why);
      if (!ok) p = Probe{};
      std::lock_guard<std::mutex> g(lock);
      if (!ok) {
        failed++;
        std::fprintf(stderr, "%svideotrain-probe: warning: row %zu (%s): cannot probe: %s; its unknown values "
                     "are set to 0\n", tty ? "\n" : "", r + 1, row.path.c_str(), why.c_str());
      }
      results[r] = p;
      std::fprintf(pf, "%zu %lld %lld %lld %s\n", r, (long long)p.num_frames, (long long)p.height,
                   (long long)p.width, format_fps(p.fps).c_str());
      std::fflush(pf);
      done++;
      const auto now = std::chrono::steady_clock::now();
      if (now - last_print > std::chrono::milliseconds(tty ? 200 : 2000)) {
        last_print = now;
        progress(false);
      }
    }
    g_object_unref(disc);
  };
  std::vector<std::thread> threads;
  for (unsigned j = 0; j < std::min<size_t>(jobs, std::max<size_t>(todo.size(), 1)); j++) threads.emplace_back(worker);
  for (auto &t : threads) t.join();
  progress(true);
  std::fclose(pf);
  if (results.size() - resumed < todo.size()) {
    std::fprintf(stderr, "videotrain-probe: stopped; %zu of %zu rows probed are kept in %s: run again to go on\n",
                 results.size(), resumed + todo.size(), partial.c_str());
    return 130;
  }

  // Every row: kept values, else the probe's (0 = unknown).
  const std::string tmp = out + ".tmp";
  FILE *of = std::fopen(tmp.c_str(), "w");
  if (!of) {
    std::fprintf(stderr, "videotrain-probe: cannot write %s: %s\n", tmp.c_str(), std::strerror(errno));
    return 1;
  }
  std::fputs(csv_record(header).c_str(), of);
  for (size_t r = 0; r < manifest->size(); r++) {
    auto rec = record(r);
    if (rec.size() < header.size()) rec.resize(header.size());
    auto it = results.find(r);
    if (it != results.end()) {
      const Probe &p = it->second;
      const std::string probed[kNumColumns] = {std::to_string(p.num_frames), std::to_string(p.height),
                                               std::to_string(p.width), p.fps > 0 ? format_fps(p.fps) : "0"};
      for (int c = 0; c < kNumColumns; c++)
        if (!valid_value(rec[size_t(col[c])], c == 3)) rec[size_t(col[c])] = probed[c];
    }
    std::fputs(csv_record(rec).c_str(), of);
  }
  const bool written = std::fflush(of) == 0 && fsync(fileno(of)) == 0;
  std::fclose(of);
  if (!written || std::rename(tmp.c_str(), out.c_str()) != 0) {
    std::fprintf(stderr, "videotrain-probe: cannot write %s: %s\n", out.c_str(), std::strerror(errno));
    return 1;
  }
  std::remove(partial.c_str());
  std::fprintf(stderr, "videotrain-probe: wrote %s (%zu rows, %zu probed, %zu could not be probed)\n", out.c_str(),
               manifest->size(), results.size(), failed);
  return 0;
}
