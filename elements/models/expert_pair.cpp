/* See expert_pair.h. */
#include "expert_pair.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace videotrain::models {

double pipeline_boundary_ratio(const std::string &transformer_dir, std::string *why) {
  const auto path = (std::filesystem::path(transformer_dir) / ".." / "model_index.json").lexically_normal();
  std::ifstream f(path);
  if (!f) {
    *why = "no " + path.string() + " to read boundary_ratio from";
    return 0;
  }
  const auto j = nlohmann::json::parse(f, nullptr, false);
  if (!j.is_object() || !j.contains("boundary_ratio") || !j["boundary_ratio"].is_number()) {
    *why = path.string() + " has no numeric boundary_ratio";
    return 0;
  }
  const double b = j["boundary_ratio"].get<double>();
  if (!(b > 0 && b < 1)) {
    *why = path.string() + "'s boundary_ratio " + std::to_string(b) + " is not in (0, 1)";
    return 0;
  }
  return b;
}

std::string expert2_name(const std::string &name) {
  const std::string peft = "transformer.";
  const std::string rest = name.rfind(peft, 0) == 0 ? name.substr(peft.size()) : name;
  return std::string(kExpert2Prefix) + "." + rest;
}

std::string expert2_dir(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir + "_2";
}

}  // namespace videotrain::models
