#include "text_encoder_engine.h"

#include <torch/cuda.h>
#include <torch/script.h>

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <list>
#include <map>
#include <stdexcept>
#include <unordered_map>

#include "content_digest.h"
#include "device_dtype.h"
#include "folder_identity.h"
#include "first_line.h"
#include "jit_load.h"
#include "latent_store.h"
#include "models/model_family.h"
#include "models/t5_encoder.h"
#include "prompt_clean.h"
#include "seeded_hash.h"
#include "t5_tokenizer.h"
#include "tensor_buffer.h"

namespace videotrain::text {

struct TextEncoderEngine::Impl {
  TextEncoderOptions opts;
  std::unique_ptr<T5Tokenizer> tokenizer;
  torch::jit::Module module;
  std::unique_ptr<models::T5Encoder> native;  // a transformers folder; else `module`
  bool native_pending = false;                // a folder whose weights load at the first cache miss
  // The family whose pipelines' convention text_embeds follows (model_family.h); null: as returned.
  const models::ModelFamily *family = nullptr;
  bool clean = false;  // the family's prompt cleaning before tokenizing
  models::TextConvention convention() const { return family ? family->text : models::TextConvention::kAsReturned; }
  c10::Device device{c10::kCPU};
  c10::ScalarType dtype = c10::kFloat;
  int64_t dim = 0;
  TextEncoderStats stats;
  // LRU: most recent first; the map points into the list.
  using Entry = std::pair<std::string, std::pair<at::Tensor, at::Tensor>>;
  std::list<Entry> lru;
  std::unordered_map<std::string, std::list<Entry>::iterator> index;
  // cache-dir: the latent cache's store; an entry's key is the caption under key_prefix.
  std::unique_ptr<LatentStore> store;
  std::string key_prefix;
  std::string store_warning;  // the first failed read or write, for the face

  std::string store_key(const std::string &caption) const { return sha256_hex(key_prefix + caption); }

  // Embedding and mask of a caption from cache-dir; false on a miss (or an unusable entry).
  bool load_stored(const std::string &caption, std::pair<at::Tensor, at::Tensor> *out) {
    if (!store) return false;
    CacheEntry e;
    std::string why;
    const auto r = store->get(store_key(caption), &e, &why);
    if (r == LatentStore::Lookup::kMiss) return false;
    const CachedTensor *emb = e.find("text_embeds"), *mask = e.find("text_mask");
    std::optional<at::Tensor> te, tm;
    if (r == LatentStore::Lookup::kHit && emb && mask && (te = tensor_of_cached(*emb, &why)) &&
        (tm = tensor_of_cached(*mask, &why)) && te->dim() == 2 && te->size(0) == opts.max_length &&
        te->size(1) == dim) {
      *out = {te->to(device, dtype), tm->to(device)};
      stats.cache_reads++;
      return true;
    }
    if (store_warning.empty()) store_warning = "unusable text cache entry, encoding again: " + why;
    return false;
  }

  void save_stored(const std::string &caption, const at::Tensor &embeds, const at::Tensor &mask) {
    if (!store || !store->writable()) return;
    CacheEntry e;
    e.tensors = {cached_tensor_of("text_embeds", embeds), cached_tensor_of("text_mask", mask)};
    e.info = "textencoder caption";
    std::string why;
    if (store->put(store_key(caption), e, &why))
      stats.cache_writes++;
    else if (store_warning.empty())
      store_warning = "cannot write to cache-dir: " + why;
  }

  void load_native() {
    try {
      native = models::T5Encoder::open(opts.model, device, dtype);
    } catch (const std::exception &ex) {
      throw std::runtime_error("cannot load text encoder folder '" + opts.model + "' (property model): " +
                               first_line(ex.what()));
    }
    native_pending = false;
  }

  TokenizedCaption tokenize(const std::string &caption) const {
    const size_t l = static_cast<size_t>(opts.max_length);
    return tokenizer->encode(clean ? text::prompt_clean(caption) : caption, l);
  }

  // input_ids/attention_mask [B, L] -> [B, L, D] in dtype on device.
  at::Tensor forward(const std::vector<const std::string *> &captions) {
    const int64_t b = static_cast<int64_t>(captions.size()), l = opts.max_length;
    auto ids = torch::empty({b, l}, torch::kLong), mask = torch::empty({b, l}, torch::kLong);
    for (int64_t i = 0; i < b; i++) {
      TokenizedCaption t = tokenize(*captions[i]);
      std::copy(t.ids.begin(), t.ids.end(), ids[i].data_ptr<int64_t>());
      std::copy(t.mask.begin(), t.mask.end(), mask[i].data_ptr<int64_t>());
    }
    torch::NoGradGuard no_grad;
    if (native_pending) load_native();
    if (native) {
      at::Tensor y;
      try {
        if (convention() == models::TextConvention::kZeroPadded) {
          const auto m = mask.to(device);
          y = native->forward(ids, m);
          y = y * m.unsqueeze(-1).to(y.scalar_type());  // h[:n] then zero rows
        } else {
          y = native->forward(ids);  // kUnmasked: no mask, every row
        }
      } catch (const std::exception &e) {
        throw std::runtime_error("the text encoder '" + opts.model + "' failed: " + first_line(e.what()));
      }
      stats.forward_calls++;
      stats.encoded += static_cast<uint64_t>(b);
      return y.to(device, dtype).contiguous();
    }
    if (convention() == models::TextConvention::kUnmasked) mask.fill_(1);  // the encoder sees every position
    c10::IValue out;
    try {
      out = module.forward({ids.to(device), mask.to(device)});
    } catch (const std::exception &e) {
      throw std::runtime_error("the text encoder '" + opts.model + "' failed: " + first_line(e.what()));
    }
    if (out.isTuple() && !out.toTupleRef().elements().empty()) out = out.toTupleRef().elements()[0];
    if (!out.isTensor())
      throw std::runtime_error("the text encoder '" + opts.model +
                               "' did not return a Tensor [B, L, D] (or a tuple starting with one)");
    at::Tensor y = out.toTensor();
    if (y.dim() != 3 || y.size(0) != b || y.size(1) != l)
      throw std::runtime_error("the text encoder '" + opts.model + "' returned shape " + shape_text(y) +
                               " for input_ids [" + std::to_string(b) + ", " + std::to_string(l) +
                               "]: expected [B, L, D] with B = " + std::to_string(b) +
                               " and L = max-length = " + std::to_string(l) +
                               (y.dim() == 3 && y.size(1) < l
                                    ? " (padded positions dropped: nn.TransformerEncoder does that in eval mode "
                                      "unless built with enable_nested_tensor=False)"
                                    : ""));
    stats.forward_calls++;
    stats.encoded += static_cast<uint64_t>(b);
    if (convention() == models::TextConvention::kZeroPadded) y = y * mask.to(y.device()).unsqueeze(-1).to(y.scalar_type());
    return y.to(device, dtype).contiguous();
  }

  static std::string shape_text(const at::Tensor &t) {
    std::string s = "[";
    for (int64_t i = 0; i < t.dim(); i++) s += (i ? ", " : "") + std::to_string(t.size(i));
    return s + "]";
  }

  void remember(const std::string &caption, at::Tensor embeds, at::Tensor mask) {
    if (opts.cache_entries == 0) return;
    lru.emplace_front(caption, std::make_pair(std::move(embeds), std::move(mask)));
    index[caption] = lru.begin();
    while (lru.size() > opts.cache_entries) {
      index.erase(lru.back().first);
      lru.pop_back();
    }
  }

  const std::pair<at::Tensor, at::Tensor> *recall(const std::string &caption) {
    auto it = index.find(caption);
    if (it == index.end()) return nullptr;
    lru.splice(lru.begin(), lru, it->second);
    return &it->second->second;
  }

  at::Tensor mask_of(const std::string &caption) const {
    TokenizedCaption t = tokenize(caption);
    return torch::tensor(t.mask, torch::kLong).to(device);
  }
};

TextEncoderEngine::TextEncoderEngine() : im_(new Impl) {}
TextEncoderEngine::~TextEncoderEngine() = default;

std::unique_ptr<TextEncoderEngine> TextEncoderEngine::create(const TextEncoderOptions &opts, std::string *error) {
  auto fail = [&](const std::string &why) -> std::unique_ptr<TextEncoderEngine> {
    if (error) *error = why;
    return nullptr;
  };
  if (opts.max_length < 1) return fail("max-length must be at least 1");
  if (opts.batch_size < 1) return fail("batch-size must be at least 1");
  if (!(opts.caption_dropout >= 0.0 && opts.caption_dropout <= 1.0))
    return fail("caption-dropout must be within [0, 1]");
  if (opts.model.empty())
    return fail("no text encoder: set the model property (a T5 / umT5 text_encoder/ folder or a TorchScript file)");
  std::unique_ptr<TextEncoderEngine> e(new TextEncoderEngine());
  Impl &im = *e->im_;
  im.opts = opts;
  {
    DeviceDtype target;
    std::string target_error;
    if (!resolve_device_dtype(opts.device, opts.dtype, &target, &target_error)) return fail(target_error);
    im.device = target.device;
    im.dtype = target.dtype;
  }
  try {
    im.tokenizer = std::make_unique<T5Tokenizer>(opts.tokenizer);
  } catch (const std::exception &ex) {
    return fail(ex.what());
  }
  const std::string &conv = opts.embedding_convention;
  const bool auto_conv = conv.empty() || conv == "auto";
  if (!auto_conv && !models::family_named(conv))
    return fail("embedding-convention '" + conv + "' is not one of auto, " + models::family_names(", "));
  struct stat st;
  if (stat(opts.model.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    models::T5Config c;
    try {
      c = models::T5Encoder::read_config(opts.model);
    } catch (const std::exception &ex) {
      return fail("cannot load text encoder folder '" + opts.model + "' (property model): " + first_line(ex.what()));
    }
    if (im.tokenizer->vocab_size() > c.vocab_size)
      return fail("the tokenizer '" + im.tokenizer->model_path() + "' (property tokenizer) has " +
                  std::to_string(im.tokenizer->vocab_size()) + " ids" +
                  (im.tokenizer->config_path().empty() ? "" : " with '" + im.tokenizer->config_path() + "'") +
                  " but '" + opts.model + "/config.json' (property model) has vocab_size " +
                  std::to_string(c.vocab_size) + ": the tokenizer/ and text_encoder/ of different models?");
    im.family = auto_conv ? models::family_of_text_encoder(c.class_name) : models::family_named(conv);
    if (!im.family)
      return fail("no model family ships '" + c.class_name + "' as its text encoder (" + opts.model +
                  "): set embedding-convention to one of " + models::family_names(", "));
    im.dim = c.d_model;
    if (opts.cache_dir.empty()) {
      try {
        im.load_native();
      } catch (const std::exception &ex) {
        return fail(ex.what());
      }
    } else {
      im.native_pending = true;
    }
  } else {
    try {
      im.module = jit_load(opts.model, im.device);
    } catch (const std::exception &ex) {
      return fail("cannot load TorchScript text encoder '" + opts.model + "' (property model): " + first_line(ex.what()));
    }
    if (!im.module.find_method("forward"))
      return fail("TorchScript text encoder '" + opts.model +
                  "' has no forward(input_ids: Tensor[B, L], attention_mask: Tensor[B, L]) -> Tensor[B, L, D]");
    im.module.eval();
    im.family = auto_conv ? nullptr : models::family_named(conv);
  }
  im.clean = opts.clean_prompts && im.family && im.family->cleans_prompts;
  if (!im.native_pending) {
    try {
      const std::string empty;
      at::Tensor y = im.forward({&empty});
      im.dim = y.size(2);
      im.remember(empty, y[0], im.mask_of(empty));
      im.stats = TextEncoderStats{};
    } catch (const std::exception &ex) {
      return fail(ex.what());
    }
  }
  if (!opts.cache_dir.empty()) {
    std::string why, model_digest;
    im.store = LatentStore::open(opts.cache_dir, true, &why);
    if (!im.store) return fail(why);
    const bool folder = im.native || im.native_pending;
    if (folder ? !folder_identity(opts.model, &model_digest, &why) : !sha256_file(opts.model, &model_digest, &why))
      return fail(why);
    // Everything that changes an embedding: tokenizer and model content, length, dtype, device type.
    im.key_prefix = "videotrain-text v1\ntokenizer " + std::to_string(im.tokenizer->digest()) + "\nmodel " +
                    model_digest + "\nmax-length " + std::to_string(opts.max_length) + "\ndtype " +
                    videotrain::dtype_name(im.dtype) + "\ndevice " + (im.device.is_cuda() ? "cuda" : "cpu") +
                    (im.family ? std::string("\nconvention ") + im.family->name + (im.clean ? " cleaned" : "")
                               : std::string()) +
                    "\ncaption ";
  }
  return e;
}

bool TextEncoderEngine::drops(uint64_t sample_id, uint32_t epoch) const {
  const double p = im_->opts.caption_dropout;
  if (p <= 0.0) return false;
  if (p >= 1.0) return true;
  const uint64_t key[3] = {im_->opts.seed, sample_id, epoch};
  uint64_t h = content_digest(key, sizeof key);
  h = short_finalize(h, kGolden64);  // FNV's high bits mix poorly over a few bytes
  return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0) < p;
}

std::vector<TextEmbedding> TextEncoderEngine::encode(const std::vector<TextRequest> &requests) {
  Impl &im = *im_;
  std::vector<TextEmbedding> out(requests.size());
  std::vector<const std::string *> effective(requests.size());
  static const std::string kEmpty;
  for (size_t i = 0; i < requests.size(); i++) {
    out[i].dropped = drops(requests[i].sample_id, requests[i].epoch);
    effective[i] = out[i].dropped ? &kEmpty : &requests[i].caption;
  }
  // Each distinct caption once: from the cache, or encoded batch_size at a time (first-seen order).
  std::map<std::string, std::pair<at::Tensor, at::Tensor>> found;
  std::vector<const std::string *> todo;
  for (const std::string *c : effective) {
    if (found.count(*c)) continue;
    if (const auto *hit = im.recall(*c)) {
      found[*c] = *hit;
    } else if (std::pair<at::Tensor, at::Tensor> stored; im.load_stored(*c, &stored)) {
      found[*c] = stored;
      im.remember(*c, stored.first, stored.second);
    } else {
      found[*c];
      todo.push_back(c);
    }
  }
  for (size_t at = 0; at < todo.size(); at += static_cast<size_t>(im.opts.batch_size)) {
    std::vector<const std::string *> batch(todo.begin() + at,
                                           todo.begin() + std::min(todo.size(), at + im.opts.batch_size));
    at::Tensor y = im.forward(batch);
    for (size_t j = 0; j < batch.size(); j++) {
      auto &f = found[*batch[j]];
      f = {y[static_cast<int64_t>(j)].clone(), im.mask_of(*batch[j])};  // not a view that pins the batch
      im.remember(*batch[j], f.first, f.second);
      im.save_stored(*batch[j], f.first, f.second);
    }
  }
  for (size_t i = 0; i < requests.size(); i++) {
    const auto &f = found.at(*effective[i]);
    out[i].embeds = f.first;
    out[i].mask = f.second;
    im.stats.captions++;
    im.stats.dropped += out[i].dropped ? 1 : 0;
  }
  return out;
}

int64_t TextEncoderEngine::embed_dim() const { return im_->dim; }
std::string TextEncoderEngine::dtype_name() const { return videotrain::dtype_name(im_->dtype); }
std::string TextEncoderEngine::device_name() const { return videotrain::device_name(im_->device); }
TextEncoderStats TextEncoderEngine::stats() const { return im_->stats; }
bool TextEncoderEngine::encoder_loaded() const { return !im_->native_pending; }
std::string TextEncoderEngine::take_warning() {
  std::string w;
  w.swap(im_->store_warning);
  return w;
}

}  // namespace videotrain::text
