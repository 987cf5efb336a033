#include "t5_tokenizer.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cstdlib>
#include <mutex>
#include <stdexcept>

#include "content_digest.h"
#include "textencoder/spm_paths.h"

namespace videotrain {

namespace {

// The SentencePiece shim (spm_shim.cpp), loaded once per process into a scope of its own.
struct SpmApi {
  void *(*load)(const char *, char *, size_t) = nullptr;
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
    api.load = reinterpret_cast<decltype(api.load)>(dlsym(h, "vt_spm_load"));
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

T5Tokenizer::T5Tokenizer(const std::string &path) : model_(new Model) {
  if (path.empty()) throw std::runtime_error("no tokenizer: set the tokenizer property (a SentencePiece spiece.model)");
  const SpmApi &api = spm_api();
  if (!api.error.empty()) throw std::runtime_error(api.error);
  char err[512] = "";
  model_->handle = api.load(path.c_str(), err, sizeof err);
  if (!model_->handle)
    throw std::runtime_error("cannot load SentencePiece model '" + path + "' (property tokenizer): " + err);
  eos_ = api.id(model_->handle, "eos");
  if (eos_ < 0)
    throw std::runtime_error("SentencePiece model '" + path +
                             "' has no EOS piece (property tokenizer): T5 tokenization ends every caption with it");
  // T5's spiece.model has pad 0; a model without a pad piece pads with 0 as T5 does.
  const int pad = api.id(model_->handle, "pad");
  pad_ = pad >= 0 ? pad : 0;
  vocab_ = api.id(model_->handle, "size");
  size_t n = 0;
  char *bytes = api.serialized(model_->handle, &n);
  digest_ = content_digest(bytes, bytes ? n : 0);
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
