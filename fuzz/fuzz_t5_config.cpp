// libFuzzer target: the T5 / umT5 encoder config.json parser (elements/models/t5_config.cpp): a config
// it accepts has sizes an encoder can be built from and bidirectional buckets that split evenly.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_input.h"
#include "models/t5_config.h"

using namespace videotrain::models;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string text(reinterpret_cast<const char *>(data), size);
  T5Config c;
  std::string error;
  if (!parse_t5_config(text, &c, &error)) {
    fuzzin::check(!error.empty());
    return 0;
  }
  fuzzin::check(c.d_model >= 1 && c.d_ff >= 1 && c.vocab_size >= 1 && c.num_layers >= 1);
  fuzzin::check(c.inner_dim() >= 1 && c.inner_dim() <= 65536);
  fuzzin::check(c.relative_attention_num_buckets % 4 == 0 &&
                c.relative_attention_max_distance > c.relative_attention_num_buckets / 4);
  fuzzin::check(c.layer_norm_epsilon > 0 && c.layer_norm_epsilon < 1);
  fuzzin::check(c.class_name == (c.umt5 ? "UMT5EncoderModel" : "T5EncoderModel"));
  return 0;
}
