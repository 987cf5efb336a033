/* libvideotrain-spm: SentencePiece behind a plain C interface, loaded by t5_tokenizer.cpp
 * with dlopen(RTLD_LOCAL | RTLD_DEEPBIND). Debian's libsentencepiece carries its own copy of
 * protobuf(-lite) and exports its symbols; LibTorch brings libprotobuf.so.32. Linked into one
 * scope, one copy's static initialisers run against the other's and the process crashes before
 * main. Here sentencepiece binds to its own copy and nothing else sees it. */
#include <sentencepiece_processor.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {
void set_error(char *err, size_t len, const std::string &text) {
  if (!err || len == 0) return;
  std::strncpy(err, text.c_str(), len - 1);
  err[len - 1] = '\0';
}
}  // namespace

extern "C" {

// The model file's bytes (the caller reads the file through its bounded open).
__attribute__((visibility("default"))) void *vt_spm_load_bytes(const char *data, size_t n, char *err, size_t err_len) {
  auto *sp = new sentencepiece::SentencePieceProcessor();
  auto st = sp->LoadFromSerializedProto(absl::string_view(data, n));
  if (!st.ok()) {
    set_error(err, err_len, st.ToString());
    delete sp;
    return nullptr;
  }
  return sp;
}

__attribute__((visibility("default"))) void vt_spm_free(void *h) {
  delete static_cast<sentencepiece::SentencePieceProcessor *>(h);
}

__attribute__((visibility("default"))) int vt_spm_id(void *h, const char *which) {
  auto *sp = static_cast<sentencepiece::SentencePieceProcessor *>(h);
  std::string w(which);
  if (w == "eos") return sp->eos_id();
  if (w == "pad") return sp->pad_id();
  if (w == "unk") return sp->unk_id();
  if (w == "size") return sp->GetPieceSize();
  // "piece:TEXT": the id of that piece, -1 when the vocabulary lacks it (PieceToId answers unk then).
  if (w.rfind("piece:", 0) == 0) {
    const std::string piece = w.substr(6);
    const int id = sp->PieceToId(piece);
    return id >= 0 && id < sp->GetPieceSize() && sp->IdToPiece(id) == piece ? id : -1;
  }
  return -1;
}

// ids: malloc'ed array of *n ids (free with free()); 0 on success.
__attribute__((visibility("default"))) int vt_spm_encode(void *h, const char *text, size_t len, int **ids, size_t *n,
                                                         char *err, size_t err_len) {
  auto *sp = static_cast<sentencepiece::SentencePieceProcessor *>(h);
  std::vector<int> out;
  auto st = sp->Encode(std::string(text, len), &out);
  if (!st.ok()) {
    set_error(err, err_len, st.ToString());
    return -1;
  }
  *n = out.size();
  *ids = static_cast<int *>(std::malloc(sizeof(int) * (out.empty() ? 1 : out.size())));
  if (!*ids) return -1;
  if (!out.empty()) std::memcpy(*ids, out.data(), sizeof(int) * out.size());
  return 0;
}

// The model's serialized proto (a digest of what the ids mean): malloc'ed, *n bytes.
__attribute__((visibility("default"))) char *vt_spm_serialized(void *h, size_t *n) {
  auto *sp = static_cast<sentencepiece::SentencePieceProcessor *>(h);
  const std::string bytes = sp->serialized_model_proto();
  *n = bytes.size();
  char *out = static_cast<char *>(std::malloc(bytes.empty() ? 1 : bytes.size()));
  if (out && !bytes.empty()) std::memcpy(out, bytes.data(), bytes.size());
  return out;
}
}
