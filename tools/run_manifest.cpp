#include "run_manifest.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace videotrain {
namespace {

namespace fs = std::filesystem;

bool is_video_name(const fs::path &p) {
  static const std::set<std::string> ext = {".mp4", ".mkv", ".webm", ".mov", ".avi", ".m4v", ".mpg", ".mpeg", ".ts", ".gif"};
  std::string x = p.extension().string();
  std::transform(x.begin(), x.end(), x.begin(), [](unsigned char c) { return static_cast<char>(tolower(c)); });
  return ext.count(x) > 0;
}

std::string csv_field(const std::string &s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

std::string size_text(uint32_t v) { return v ? std::to_string(v) : ""; }

}  // namespace

bool folder_videos(const std::string &dir, std::vector<std::pair<std::string, std::string>> *videos,
                   std::string *why) {
  std::vector<fs::path> found;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec))
    if (it->is_regular_file() && is_video_name(it->path())) found.push_back(it->path());
  if (ec) {
    *why = "cannot list " + dir + ": " + ec.message();
    return false;
  }
  std::sort(found.begin(), found.end());
  if (found.empty()) {
    *why = dir + " holds no videos (.mp4, .mkv, .webm, .mov, .avi, ...) and no videos.txt";
    return false;
  }
  for (const auto &v : found) {
    fs::path txt = v;
    txt.replace_extension(".txt");
    std::ifstream in(txt);
    if (!in) {
      *why = v.string() + " has no caption file " + txt.filename().string() + " beside it (each video needs a same-named .txt)";
      return false;
    }
    std::stringstream ss;
    ss << in.rdbuf();
    std::string cap = ss.str();
    while (!cap.empty() && isspace(static_cast<unsigned char>(cap.back()))) cap.pop_back();
    size_t b = 0;
    while (b < cap.size() && isspace(static_cast<unsigned char>(cap[b]))) b++;
    videos->emplace_back(fs::absolute(v).lexically_normal().string(), cap.substr(b));
  }
  return true;
}

std::string folder_row(const std::string &path, const std::string &caption) {
  return csv_field(path) + "," + csv_field(caption) + ",,,,\n";
}

bool manifest_rows(const ManifestOptions &options, std::vector<std::string> *rows, std::vector<std::string> *notes,
                   size_t *left_out, std::string *why) {
  constexpr size_t max_notes = 5;
  auto m = Manifest::open(options, why);
  if (!m) return false;
  for (const auto &w : m->warnings()) notes->push_back(options.location + ": " + w);
  for (size_t i = 0; i < m->size(); i++) {
    ManifestRow r = m->row(i);
    if (!r.error.empty()) {
      if ((*left_out)++ < max_notes)
        notes->push_back(options.location + " row " + std::to_string(r.row + 1) + " left out: " + r.error);
      continue;
    }
    VideoSize z = m->video_size(i);
    double fps = z.fps > 0 ? z.fps : r.fps;
    char f[32] = "";
    if (fps > 0) std::snprintf(f, sizeof f, "%g", fps);
    rows->push_back(csv_field(fs::absolute(r.path).lexically_normal().string()) + "," + csv_field(r.caption) + "," +
                    size_text(z.frames) + "," + size_text(z.height) + "," + size_text(z.width) + "," + f + "\n");
  }
  return true;
}

}  // namespace videotrain
