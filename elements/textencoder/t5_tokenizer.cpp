#include "t5_tokenizer.h"
#include "regular_file.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "content_digest.h"
#include "textencoder/spm_paths.h"

namespace videotrain {

namespace {

// The SentencePiece shim (spm_shim.cpp), loaded once per process into a scope of its own.
struct SpmApi {
  void *(*load)(const char *, size_t, char *, size_t) = nullptr;  // the model file's bytes
  void (*free_model)(void *) = nullptr;
  int (*id)(void *, const char *) = nullptr;
  int (*encode)(void *, const char *, size_t, int **, size_t *, char *, size_t) = nullptr;
  char *(*serialized)(void *, size_t *) = nullptr;
  std::string error;
};

bool exists(const std::string &p) {
  struct stat st;
  return !p.empty() && stat(p.c_str(), &st) == 0;
}

const SpmApi &spm_api() {
  static SpmApi api;
  static std::once_flag once;
  std::call_once(once, [] {
    std::vector<std::string> candidates;
    if (const char *env = std::getenv("VIDEOTRAIN_SPM_LIBRARY")) candidates.push_back(env);
    candidates.push_back(VIDEOTRAIN_SPM_BUILD_PATH);    // running from the build tree
    candidates.push_back(VIDEOTRAIN_SPM_INSTALL_PATH);  // installed
    std::string tried;
    void *h = nullptr;
    for (const auto &c : candidates) {
      if (!exists(c)) {
        tried += " " + c + " (missing)";
        continue;
      }
      h = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
      if (h) break;
      tried += " " + c + " (" + dlerror() + ")";
    }
    if (!h) {
      api.error = "cannot load the SentencePiece library libvideotrain-spm.so; tried:" + tried +
                  " (set VIDEOTRAIN_SPM_LIBRARY to its path)";
      return;
    }
    api.load = reinterpret_cast<decltype(api.load)>(dlsym(h, "vt_spm_load_bytes"));
    api.free_model = reinterpret_cast<decltype(api.free_model)>(dlsym(h, "vt_spm_free"));
    api.id = reinterpret_cast<decltype(api.id)>(dlsym(h, "vt_spm_id"));
    api.encode = reinterpret_cast<decltype(api.encode)>(dlsym(h, "vt_spm_encode"));
    api.serialized = reinterpret_cast<decltype(api.serialized)>(dlsym(h, "vt_spm_serialized"));
    if (!api.load || !api.free_model || !api.id || !api.encode || !api.serialized)
      api.error = "libvideotrain-spm.so lacks its functions (a stale build?)";
  });
  return api;
}

}  // namespace

struct T5Tokenizer::Model {
  void *handle = nullptr;
  ~Model() {
    if (handle) spm_api().free_model(handle);
  }
};

namespace {

// A JSON file of the tokenizer folder; null when absent. Throws naming it when unreadable or not JSON.
nlohmann::json read_json(const std::string &path) {
  if (!exists(path)) return nullptr;
  std::string text, why;
  if (!read_small_file(path, kMaxConfigBytes, &text, &why))
    throw std::runtime_error("tokenizer file " + why + " (property tokenizer)");
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object()) throw std::runtime_error("tokenizer file '" + path + "' is not a JSON object (property tokenizer)");
  return j;
}

// A special token as transformers writes it: "</s>" or {"content": "</s>", ...}; "" when absent.
std::string token_text(const nlohmann::json &j, const char *key) {
  if (!j.is_object() || !j.contains(key)) return "";
  const auto &v = j[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

}  // namespace

T5Tokenizer::T5Tokenizer(const std::string &path) : model_(new Model) {
  if (path.empty())
    throw std::runtime_error("no tokenizer: set the tokenizer property (a tokenizer folder or its spiece.model)");
  const SpmApi &api = spm_api();
  if (!api.error.empty()) throw std::runtime_error(api.error);
  struct stat st;
  const bool is_dir = stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  const std::string dir = is_dir ? path : std::filesystem::path(path).parent_path().string();
  model_path_ = is_dir ? path + "/spiece.model" : path;
  if (is_dir && !exists(model_path_))
    throw std::runtime_error("tokenizer folder '" + path + "' has no spiece.model (property tokenizer): a T5 / umT5 "
                             "tokenizer/ folder holds one");
  // Read here through the bounded open (a FIFO or device given as the model is refused, not waited on)
  // and handed over as bytes.
  std::string model_bytes, why;
  if (!read_small_file(model_path_, 256u << 20, &model_bytes, &why))
    throw std::runtime_error("cannot load SentencePiece model '" + model_path_ + "' (property tokenizer): " + why);
  char err[512] = "";
  model_->handle = api.load(model_bytes.data(), model_bytes.size(), err, sizeof err);
  if (!model_->handle)
    throw std::runtime_error("cannot load SentencePiece model '" + model_path_ + "' (property tokenizer): " + err);
  const int pieces = api.id(model_->handle, "size");
  // transformers' special and added tokens: the folder's JSON files (absent beside a bare spiece.model).
  const std::string dir_prefix = dir.empty() ? "" : dir + "/";
  const auto config = read_json(dir_prefix + "tokenizer_config.json");
  const auto special = read_json(dir_prefix + "special_tokens_map.json");
  const auto added_file = read_json(dir_prefix + "added_tokens.json");
  if (!config.is_null()) config_path_ = dir_prefix + "tokenizer_config.json";
  else if (!special.is_null()) config_path_ = dir_prefix + "special_tokens_map.json";
  std::map<std::string, int> added;
  int top = pieces;  // one past the highest id
  auto add = [&](const std::string &content, int64_t id, const std::string &file) {
    if (id < 0 || id > (1 << 24))
      throw std::runtime_error("tokenizer file '" + file + "' gives '" + content + "' the id " + std::to_string(id) +
                               " (property tokenizer)");
    added[content] = static_cast<int>(id);
    top = std::max(top, static_cast<int>(id) + 1);
  };
  if (config.is_object() && config.contains("added_tokens_decoder") && config["added_tokens_decoder"].is_object())
    for (const auto &[id, v] : config["added_tokens_decoder"].items()) {
      const std::string content = token_text(nlohmann::json{{"t", v}}, "t");
      if (content.empty() || id.empty() || id.find_first_not_of("0123456789") != std::string::npos || id.size() > 8)
        throw std::runtime_error("tokenizer file '" + config_path_ + "' has an unreadable added_tokens_decoder entry '" +
                                 id + "' (property tokenizer)");
      add(content, std::stoll(id), config_path_);
    }
  if (added_file.is_object())
    for (const auto &[content, id] : added_file.items()) {
      if (!id.is_number_integer())
        throw std::runtime_error("tokenizer file '" + dir_prefix + "added_tokens.json' gives '" + content +
                                 "' no whole-number id (property tokenizer)");
      add(content, id.get<int64_t>(), dir_prefix + "added_tokens.json");
    }
  // T5Tokenizer's sentinels when no file lists them: <extra_id_0> is the last id.
  if (config.is_object() && config.contains("extra_ids") && config["extra_ids"].is_number_integer()) {
    const int64_t extra = config["extra_ids"].get<int64_t>();
    if (extra < 0 || extra > 100000)
      throw std::runtime_error("tokenizer file '" + config_path_ + "' has extra_ids " + std::to_string(extra) +
                               " (property tokenizer)");
    for (int64_t i = 0; i < extra; i++) {
      const std::string name = "<extra_id_" + std::to_string(i) + ">";
      if (!added.count(name)) add(name, pieces + extra - 1 - i, config_path_);
    }
  }
  vocab_ = top;
  // A special token's id: an added token, else a SentencePiece piece; special_tokens_map.json wins.
  auto special_id = [&](const char *key, int fallback) {
    std::string text = token_text(special, key), file = dir_prefix + "special_tokens_map.json";
    if (text.empty()) text = token_text(config, key), file = config_path_;
    if (text.empty()) return fallback;
    if (auto it = added.find(text); it != added.end()) return it->second;
    const int id = api.id(model_->handle, ("piece:" + text).c_str());
    if (id < 0)
      throw std::runtime_error("tokenizer file '" + file + "' names " + key + " '" + text + "', which '" + model_path_ +
                               "' does not have (property tokenizer)");
    return id;
  };
  eos_ = special_id("eos_token", api.id(model_->handle, "eos"));
  if (eos_ < 0)
    throw std::runtime_error("SentencePiece model '" + model_path_ +
                             "' has no EOS piece (property tokenizer): T5 tokenization ends every caption with it");
  // T5's spiece.model has pad 0; a model without a pad piece pads with 0 as T5 does.
  const int pad = api.id(model_->handle, "pad");
  pad_ = special_id("pad_token", pad >= 0 ? pad : 0);
  size_t n = 0;
  char *bytes = api.serialized(model_->handle, &n);
  const int ids[2] = {eos_, pad_};
  digest_ = content_digest(bytes, bytes ? n : 0) ^ (content_digest(ids, sizeof ids) * 31);
  std::free(bytes);
}

T5Tokenizer::~T5Tokenizer() = default;

TokenizedCaption T5Tokenizer::encode(const std::string &caption, size_t max_length) const {
  if (max_length == 0) throw std::runtime_error("max-length must be at least 1 (room for EOS)");
  int *ids = nullptr;
  size_t n = 0;
  char err[512] = "";
  if (spm_api().encode(model_->handle, caption.data(), caption.size(), &ids, &n, err, sizeof err) != 0)
    throw std::runtime_error(std::string("SentencePiece cannot encode a caption: ") + err);
  const size_t kept = std::min(n, max_length - 1);  // EOS stays last
  TokenizedCaption out;
  out.ids.assign(max_length, pad_);
  out.mask.assign(max_length, 0);
  for (size_t i = 0; i < kept; i++) {
    out.ids[i] = ids[i];
    out.mask[i] = 1;
  }
  std::free(ids);
  out.ids[kept] = eos_;
  out.mask[kept] = 1;
  return out;
}

}  // namespace videotrain
