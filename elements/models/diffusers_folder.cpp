#include "diffusers_folder.h"

#include "regular_file.h"

#include <sys/stat.h>

#include <nlohmann/json.hpp>
#include <set>

namespace videotrain::models {

using json = nlohmann::json;

namespace {
constexpr uint64_t kMaxJson = kMaxConfigBytes;

bool is_regular(const std::string &path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool exists(const std::string &path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}
}  // namespace

std::string DiffusersFolder::weights_description() const {
  if (files.size() == 1) return files[0]->path();
  return std::to_string(files.size()) + " shards in " + dir;
}

bool parse_shard_index(const std::string &text, std::map<std::string, std::string> *out, std::string *error) {
  const json j = json::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
    *error = "is not a shard index (a JSON object with a \"weight_map\" object)";
    return false;
  }
  for (const auto &[name, file] : j["weight_map"].items()) {
    if (!file.is_string()) {
      *error = "maps '" + name + "' to something that is not a file name";
      return false;
    }
    const std::string f = file.get<std::string>();
    // Shards live beside the index: no folders, no way out of it.
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..") {
      *error = "maps '" + name + "' to '" + f + "', which is not a file name beside the index";
      return false;
    }
    (*out)[name] = f;
  }
  if (out->empty()) {
    *error = "names no tensors";
    return false;
  }
  return true;
}

std::string shard_index_json(const std::map<std::string, std::string> &weight_map, uint64_t total_size) {
  json j;
  j["metadata"] = {{"total_size", total_size}};
  j["weight_map"] = json::object();
  for (const auto &[k, v] : weight_map) j["weight_map"][k] = v;
  return j.dump(2) + "\n";
}

bool open_diffusers_folder(const std::string &dir, const std::string &stem, DiffusersFolder *out, std::string *error) {
  out->dir = dir;
  if (!videotrain::read_small_file(dir + "/config.json", kMaxJson, &out->config_text, error)) return false;
  const json cfg = json::parse(out->config_text, nullptr, false);
  if (!cfg.is_object()) {
    *error = "'" + dir + "/config.json' is not a JSON object";
    return false;
  }
  if (cfg.contains("_class_name") && cfg["_class_name"].is_string())
    out->class_name = cfg["_class_name"].get<std::string>();
  else if (cfg.contains("architectures") && cfg["architectures"].is_array() && !cfg["architectures"].empty() &&
           cfg["architectures"][0].is_string())
    out->class_name = cfg["architectures"][0].get<std::string>();
  const std::string single = dir + "/" + stem + ".safetensors", index = single + ".index.json";
  std::vector<std::string> paths;
  std::map<std::string, std::string> weight_map;
  if (exists(single)) {
    paths.push_back(single);
  } else if (exists(index)) {
    std::string text;
    if (!videotrain::read_small_file(index, kMaxJson, &text, error)) return false;
    if (!parse_shard_index(text, &weight_map, error)) {
      *error = "'" + index + "' " + *error;
      return false;
    }
    std::set<std::string> seen;
    for (const auto &[name, f] : weight_map)
      if (seen.insert(f).second) paths.push_back(dir + "/" + f);
  } else {
    *error = "'" + dir + "' has neither " + stem + ".safetensors nor " + stem + ".safetensors.index.json";
    return false;
  }
  for (const auto &p : paths) {
    if (!exists(p)) {
      *error = "'" + index + "' names the shard '" + p + "', which does not exist";
      return false;
    }
    if (!is_regular(p)) {
      *error = "'" + p + "' is not a regular file";
      return false;
    }
    auto f = SafetensorsFile::open(p, error);
    if (!f) return false;
    for (const auto &[name, e] : f->entries()) {
      if (!weight_map.empty()) {
        auto it = weight_map.find(name);
        if (it == weight_map.end() || dir + "/" + it->second != p) {
          *error = "'" + p + "' holds '" + name + "', which the index '" + index + "' does not place there";
          return false;
        }
      }
      if (!out->tensors.emplace(name, &e).second) {
        *error = "tensor '" + name + "' is in two weight files of '" + dir + "'";
        return false;
      }
    }
    out->files.push_back(std::move(f));
  }
  for (const auto &[name, f] : weight_map)
    if (!out->tensors.count(name)) {
      *error = "'" + index + "' places '" + name + "' in '" + f + "', which does not hold it";
      return false;
    }
  return true;
}

}  // namespace videotrain::models
