/* T5-style tokenization with a SentencePiece model (a T5 tokenizer folder's spiece.model):
 * the caption's pieces, then the model's EOS id, truncated so that EOS stays last within
 * max_length, padded with the model's pad id; the mask is 1 on the pieces and EOS. */
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
  // Throws std::runtime_error naming the file and the property (tokenizer) when it cannot load,
  // or when the model has no EOS id.
  explicit T5Tokenizer(const std::string &path);
  ~T5Tokenizer();
  T5Tokenizer(const T5Tokenizer &) = delete;
  T5Tokenizer &operator=(const T5Tokenizer &) = delete;

  TokenizedCaption encode(const std::string &caption, size_t max_length) const;
  int eos_id() const { return eos_; }
  int pad_id() const { return pad_; }
  int vocab_size() const { return vocab_; }
  // Content digest of the model file (a cache key part: another spiece.model, other ids).
  uint64_t digest() const { return digest_; }

 private:
  struct Model;
  std::unique_ptr<Model> model_;
  int eos_ = -1;
  int vocab_ = 0;
  int pad_ = 0;
  uint64_t digest_ = 0;
};

}  // namespace videotrain
