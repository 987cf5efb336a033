/* textencoder: captions/s of the engine on a caption stream where captions repeat, with its
 * cache and without (cache-entries 0), and a plain PyTorch loop (bench/textencoder_bench.py
 * measures that one and runs this). Prints captions/s and the ratios.
 *
 *   textencoder-bench --tokenizer spiece.model --model encoder.pt [--captions N] [--distinct K]
 *                     [--batch-size B] [--max-length L] [--threads T] */
#include <ATen/Parallel.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "textencoder/text_encoder_engine.h"

using namespace videotrain::text;

int main(int argc, char **argv) {
  TextEncoderOptions o;
  o.device = "cpu";
  int captions = 2000, distinct = 100, threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--tokenizer") o.tokenizer = v;
    else if (a == "--model") o.model = v;
    else if (a == "--captions") captions = std::atoi(v.c_str());
    else if (a == "--distinct") distinct = std::atoi(v.c_str());
    else if (a == "--batch-size") o.batch_size = std::atoi(v.c_str());
    else if (a == "--max-length") o.max_length = std::atoi(v.c_str());
    else if (a == "--threads") threads = std::atoi(v.c_str());
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  at::set_num_threads(threads);
  // Caption i of the stream is distinct caption (i * 7919) mod K: every one repeats, interleaved.
  std::vector<TextRequest> stream;
  for (int i = 0; i < captions; i++) {
    int k = static_cast<int>((static_cast<int64_t>(i) * 7919) % distinct);
    stream.push_back({"a clip of pattern number " + std::to_string(k) + " moving slowly across the frame", uint64_t(i), 0});
  }
  auto measure = [&](size_t cache_entries) {
    TextEncoderOptions c = o;
    c.cache_entries = cache_entries;
    std::string err;
    auto e = TextEncoderEngine::create(c, &err);
    if (!e) {
      std::fprintf(stderr, "%s\n", err.c_str());
      std::exit(1);
    }
    auto t0 = std::chrono::steady_clock::now();
    // As the element calls it: batch-size buffers at a time.
    for (size_t at = 0; at < stream.size(); at += static_cast<size_t>(c.batch_size)) {
      std::vector<TextRequest> batch(stream.begin() + at,
                                     stream.begin() + std::min(stream.size(), at + static_cast<size_t>(c.batch_size)));
      e->encode(batch);
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("engine, cache %-6s: %8.1f captions/s (%llu encoded, %llu model calls)\n",
                cache_entries ? "on" : "off", stream.size() / s,
                static_cast<unsigned long long>(e->stats().encoded),
                static_cast<unsigned long long>(e->stats().forward_calls));
    return stream.size() / s;
  };
  double off = measure(0), on = measure(4096);
  std::printf("ENGINE cached/uncached %.2f\n", on / off);
  std::printf("ENGINE_UNCACHED %.3f\nENGINE_CACHED %.3f\n", off, on);
  return 0;
}
