/* Text-conditioned training (a textencoder's embeddings in the micro-batches): a TorchScript
 * training_step(latents, text_embeds, text_mask) gives the same step-1 loss and weights as the
 * same module stepped by PyTorch's AdamW in Python; conditioning that does not match the model
 * is an error; builtin:tiny-t2v attends only to unmasked tokens. */
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/script.h>

#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "engine_helpers.h"
#include "test_util.h"
#include "models/train_model.h"
#include "ddptrainsink/trainer_engine.h"

using namespace videotrain;
using namespace enginetest;

namespace {

// The model, its inputs (buffers of inputs.pt) and PyTorch's step 1 (expected.txt: the loss, then
// "name v0 v1 ..." per parameter after one AdamW step with the trainer's defaults and lr 1e-3).
const char *kTextModel = R"(
import os, sys, torch
class T2V(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 4)
        self.conv = torch.nn.Conv3d(4, 4, 1)
    def losses(self, x, e, m):
        mf = m.to(e.dtype).unsqueeze(-1)
        pooled = (e * mf).sum(1) / mf.sum(1).clamp(min=1.0)
        pred = self.conv(x) + self.proj(pooled).view(x.size(0), -1, 1, 1, 1)
        return (pred - (0.5 * x.flip([1]) + 0.25)).pow(2).mean([1, 2, 3, 4])
    @torch.jit.export
    def training_step(self, latents: torch.Tensor, text_embeds: torch.Tensor, text_mask: torch.Tensor) -> torch.Tensor:
        return self.losses(latents, text_embeds, text_mask).mean()
    @torch.jit.export
    def validation_step(self, latents: torch.Tensor, text_embeds: torch.Tensor, text_mask: torch.Tensor,
                        seeds: torch.Tensor) -> torch.Tensor:
        return self.losses(latents, text_embeds, text_mask)
    def forward(self, x):
        return x
class Inputs(torch.nn.Module):
    def __init__(self, x, e, m):
        super().__init__()
        self.register_buffer("x", x)
        self.register_buffer("e", e)
        self.register_buffer("m", m)
    def forward(self):
        return self.x
torch.manual_seed(3)
torch.jit.script(T2V()).save(sys.argv[1])
out = os.path.dirname(sys.argv[1])
g = torch.Generator().manual_seed(11)
x, e = torch.randn(2, 4, 2, 4, 4, generator=g), torch.randn(2, 6, 8, generator=g)
m = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
torch.jit.script(Inputs(x, e, m)).save(os.path.join(out, "inputs.pt"))
model = torch.jit.load(sys.argv[1])
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
loss = model.training_step(x, e, m)
loss.backward()
opt.step()
with open(os.path.join(out, "expected.txt"), "w") as f:
    f.write(repr(loss.item()) + "\n")
    for name, p in model.named_parameters():
        f.write(name + " " + " ".join(repr(v) for v in p.detach().flatten().tolist()) + "\n")
)";

ModelInputs inputs_of(const torch::jit::Module &holder) {
  std::map<std::string, at::Tensor> b;
  for (const auto &t : holder.named_buffers()) b[t.name] = t.value;
  ModelInputs in;
  in.latents = b.at("x");
  in.text_embeds = b.at("e");
  in.text_mask = b.at("m");
  return in;
}

}  // namespace

TEST(TextModels, ScriptTextStepEqualsPytorchAdamW) {
  vttest::TempDir dir;
  const std::string model = vttest::script_model(dir, "t2v", kTextModel);
  ASSERT_FALSE(model.empty());
  ModelInputs in = inputs_of(torch::jit::load(dir.file("inputs.pt")));
  std::ifstream f(dir.file("expected.txt"));
  double want_loss = 0;
  f >> want_loss;
  std::map<std::string, std::vector<float>> want;
  std::string line;
  std::getline(f, line);
  while (std::getline(f, line)) {
    std::istringstream s(line);
    std::string name;
    s >> name;
    double v;
    while (s >> v) want[name].push_back(static_cast<float>(v));
  }
  ASSERT_EQ(want.size(), 4u);

  TrainerEngine e(cpu_config(model));
  ASSERT_TRUE(e.start()) << e.error();
  ASSERT_TRUE(e.set_stream_text(true)) << e.error();
  ASSERT_EQ(e.process_inputs(in, info_for(0, 0, 1, 2)), ProcessResult::kOk) << e.error();
  EXPECT_NEAR(e.last_loss(), want_loss, 1e-6 * std::abs(want_loss));
  EXPECT_LT(max_rel_diff(e.parameters_cpu(), want), 1e-5);
}

TEST(TextModels, ConditioningThatDoesNotMatchTheModelIsAnError) {
  vttest::TempDir dir;
  const std::string text_model = vttest::script_model(dir, "t2v", kTextModel);
  ASSERT_FALSE(text_model.empty());
  {  // text model, caption stream: at the caps, and at the first micro-batch
    TrainerEngine e(cpu_config(text_model));
    ASSERT_TRUE(e.start()) << e.error();
    EXPECT_FALSE(e.set_stream_text(false));
    EXPECT_NE(e.error().find("put a textencoder after vaeencoder"), std::string::npos) << e.error();
    TrainerEngine e2(cpu_config(text_model));
    ASSERT_TRUE(e2.start()) << e2.error();
    auto x = at::randn({2, 4, 2, 4, 4});
    EXPECT_EQ(e2.process_tensor(x, info_for(0, 0, 1, 2)), ProcessResult::kError);
    EXPECT_NE(e2.error().find("takes text embeddings"), std::string::npos) << e2.error();
    EXPECT_EQ(e2.steps_done(), 0u);
  }
  {  // caption model, text stream
    TrainerEngine e(cpu_config(vttest::make_script_model(dir)));
    ASSERT_TRUE(e.start()) << e.error();
    EXPECT_FALSE(e.set_stream_text(true));
    EXPECT_NE(e.error().find("takes captions"), std::string::npos) << e.error();
  }
  {  // a builtin built at the first micro-batch: checked there
    TrainerEngine e(cpu_config("builtin:tiny-t2v"));
    ASSERT_TRUE(e.start()) << e.error();
    ASSERT_TRUE(e.set_stream_text(false));  // nothing built yet to disagree with
    EXPECT_EQ(e.process_tensor(at::randn({2, 4, 2, 4, 4}), info_for(0, 0, 1, 2)), ProcessResult::kError);
    EXPECT_NE(e.error().find("needs text embeddings"), std::string::npos) << e.error();
  }
}

// tiny-t2v's cross-attention masks padding: changing embeddings where text_mask is 0 leaves the
// step-1 loss as it is, changing them where it is 1 does not; and it learns.
TEST(TextModels, TinyT2VAttendsToUnmaskedTokensAndLearns) {
  auto g = at::detail::createCPUGenerator(5);
  ModelInputs in;
  in.latents = at::randn({2, 4, 3, 6, 5}, g);  // odd width: patches pad and crop
  in.text_embeds = at::randn({2, 7, 16}, g);
  in.text_mask = at::zeros({2, 7}, at::kLong);
  in.text_mask.narrow(1, 0, 3).fill_(1);
  auto step1 = [&](const ModelInputs &x) {
    TrainerEngine e(cpu_config("builtin:tiny-t2v"));
    EXPECT_TRUE(e.start()) << e.error();
    EXPECT_EQ(e.process_inputs(x, info_for(0, 0, 1, 2)), ProcessResult::kOk) << e.error();
    return e.last_loss();
  };
  const double base = step1(in);
  ASSERT_TRUE(std::isfinite(base));
  ModelInputs padded = in;
  padded.text_embeds = in.text_embeds.clone();
  padded.text_embeds.narrow(1, 3, 4).normal_(0, 10, g);
  EXPECT_DOUBLE_EQ(step1(padded), base);
  ModelInputs words = in;
  words.text_embeds = in.text_embeds.clone();
  words.text_embeds.narrow(1, 0, 3).normal_(0, 10, g);
  EXPECT_NE(step1(words), base);

  TrainerEngine e(cpu_config("builtin:tiny-t2v"));
  ASSERT_TRUE(e.start()) << e.error();
  std::vector<double> losses;
  for (uint64_t s = 0; s < 30; s++) {
    ASSERT_EQ(e.process_inputs(in, info_for(s, 0, 1, 2)), ProcessResult::kOk) << e.error();
    losses.push_back(e.last_loss());
  }
  double first = 0, last = 0;
  for (int i = 0; i < 10; i++) first += losses[i], last += losses[20 + i];
  EXPECT_LT(last, 0.9 * first) << "first 10 steps " << first / 10 << ", last 10 " << last / 10;
}
