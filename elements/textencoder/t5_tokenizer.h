/* T5-style tokenization with a SentencePiece model (a T5 tokenizer folder's spiece.model), as
 * transformers' T5Tokenizer (legacy) does: the caption's pieces, then EOS, truncated so that EOS stays
 * last within max_length, padded with the pad id; the mask is 1 on the pieces and EOS. In a tokenizer
 * folder (or beside the file) tokenizer_config.json / special_tokens_map.json name the EOS, pad and unk
 * tokens and the added ones (extra_ids sentinels), which count in the vocabulary size. */
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace videotrain {

struct TokenizedCaption {
  std::vector<int64_t> ids;   // max_length entries
  std::vector<int64_t> mask;  // 1 on pieces and EOS, 0 on padding
};

class T5Tokenizer {
 public:
  // `path`: spiece.model, or the folder holding it. Throws std::runtime_error naming the file and the
  // property (tokenizer) when it cannot load, when a JSON file is malformed or names a special token the
  // vocabulary lacks, or when there is no EOS.
  explicit T5Tokenizer(const std::string &path);
  ~T5Tokenizer();
  T5Tokenizer(const T5Tokenizer &) = delete;
  T5Tokenizer &operator=(const T5Tokenizer &) = delete;

  TokenizedCaption encode(const std::string &caption, size_t max_length) const;
  int eos_id() const { return eos_; }
  int pad_id() const { return pad_; }
  // Ids the tokenizer can produce: SentencePiece's pieces plus added tokens (transformers' len(tokenizer)).
  int vocab_size() const { return vocab_; }
  // The spiece.model read, and the JSON files that set special tokens ("" when none).
  const std::string &model_path() const { return model_path_; }
  const std::string &config_path() const { return config_path_; }
  // Content digest of the model file (a cache key part: another spiece.model, other ids).
  uint64_t digest() const { return digest_; }

 private:
  struct Model;
  std::unique_ptr<Model> model_;
  int eos_ = -1;
  int vocab_ = 0;
  int pad_ = 0;
  uint64_t digest_ = 0;
  std::string model_path_, config_path_;
};

}  // namespace videotrain
