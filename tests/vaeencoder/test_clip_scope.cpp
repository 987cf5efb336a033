/* norm-scope=clip: CogVideoXEncoder::forward_clip_scope against diffusers' single pass over the
 * whole clip (single_pass.T{T} in the tiny_a reference cases), chunk-frames 8 and 4, with the
 * levels kept in memory and spilled to a file. */
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "vae_test_util.h"
#include "vaeencoder/cogvideox_encoder.h"

using namespace videotrain::vae;

namespace {

// diffusers' chunks: [0, k + r), then [k*i + r, k*(i+1) + r), r = T mod k.
std::vector<at::Tensor> chunks_of(const at::Tensor &video, int k) {
  const int64_t T = video.size(2), r = T % k;
  std::vector<at::Tensor> out;
  int64_t start = 0, end = std::min<int64_t>(T, k + r);
  while (start < T) {
    out.push_back(video.narrow(2, start, end - start));
    start = end;
    end = std::min<int64_t>(T, end + k);
  }
  return out;
}

}  // namespace

TEST(ClipScope, WholeClipStatisticsEqualDiffusersSinglePass) {
  vaetest::Cases cases;
  ASSERT_TRUE(cases.ok());
  auto enc = CogVideoXEncoder::load(vaetest::tiny_a_dir(), c10::Device(c10::kCPU), at::kFloat);
  for (int T : {1, 9, 25}) {
    const std::string t = ".T" + std::to_string(T);
    at::Tensor video = cases.get("input" + t), single = cases.get("single_pass" + t), chunked = cases.get("chunked" + t);
    for (int k : {8, 4})
      for (bool spill : {false, true}) {
        at::Tensor got = enc->forward_clip_scope(chunks_of(video, k), spill);
        EXPECT_LT(vaetest::rel_l2(got, single), 1e-5) << "T=" << T << " k=" << k << " spill=" << spill;
        if (T > 9) EXPECT_GT(vaetest::rel_l2(got, chunked), 1e-2) << "chunk statistics, not the clip's";
      }
  }
}
