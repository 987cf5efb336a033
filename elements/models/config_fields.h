/* Fields of the config.json files the native models read (diffusers' and transformers'): a key that
 * is absent keeps the class's default; one of the wrong type or out of range is an error naming the
 * key and the value. Header-only over nlohmann::json, no torch (the config fuzz targets build it). */
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace videotrain::models {

inline bool get_count(const nlohmann::json &j, const char *key, int64_t lo, int64_t hi, int64_t *out,
                      std::string *error) {
  if (!j.contains(key)) return true;
  const auto &v = j[key];
  if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi) {
    *error = std::string("'") + key + "' is " + v.dump() + ", expected a whole number in [" + std::to_string(lo) +
             ", " + std::to_string(hi) + "]";
    return false;
  }
  *out = v.get<int64_t>();
  return true;
}

inline bool get_bool(const nlohmann::json &j, const char *key, bool *out, std::string *error) {
  if (!j.contains(key)) return true;
  if (!j[key].is_boolean()) {
    *error = std::string("'") + key + "' is " + j[key].dump() + ", expected true or false";
    return false;
  }
  *out = j[key].get<bool>();
  return true;
}

// A number strictly between lo and hi.
inline bool get_real(const nlohmann::json &j, const char *key, double lo, double hi, double *out, std::string *error) {
  if (!j.contains(key)) return true;
  const auto &v = j[key];
  if (!v.is_number() || !(v.get<double>() > lo && v.get<double>() < hi)) {
    *error = std::string("'") + key + "' is " + v.dump() + ", expected a number in (" + std::to_string(lo) + ", " +
             std::to_string(hi) + ")";
    return false;
  }
  *out = v.get<double>();
  return true;
}

// A diffusers config: "" when `_class_name` is `cls` and every key not starting with '_' is in
// `known`, else what is wrong (`port` names the port in the message: "Wan", "CogVideoX").
template <size_t N>
std::string check_diffusers_keys(const nlohmann::json &j, const char *cls, const char *(&known)[N], const char *port) {
  if (!j.contains("_class_name") || j["_class_name"] != cls)
    return "config.json's _class_name is " + (j.contains("_class_name") ? j["_class_name"].dump() : "missing") +
           ", not \"" + cls + "\"";
  for (const auto &[key, value] : j.items()) {
    if (key.rfind('_', 0) == 0) continue;  // _class_name, _diffusers_version, _name_or_path
    bool ok = false;
    for (const char *k : known) ok = ok || key == k;
    if (!ok) return "config.json key '" + key + "' is not one this " + port + " port supports";
  }
  return "";
}

}  // namespace videotrain::models
