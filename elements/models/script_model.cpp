/* The TorchScript adapter: a file with training_step (and optionally validation_step) taking
 * captions or text embeddings, as a TrainModel. */
#include "model_parts.h"

#include <torch/script.h>
#include <torch/torch.h>

#include <map>
#include <sstream>
#include <stdexcept>

#include "first_line.h"
#include "jit_load.h"

namespace videotrain {

namespace {

// TorchScript's list of strings from the captions.
c10::List<std::string> caption_list(const std::vector<std::string> &captions) {
  c10::List<std::string> caps;
  for (const auto &c : captions) caps.push_back(c);
  return caps;
}

class ScriptModel : public TrainModel {
 public:
  ScriptModel(const std::string &path, const c10::Device &device) : path_(path) {
    try {
      module_ = jit_load(path, device);
    } catch (const std::exception &e) {
      throw std::runtime_error("cannot load TorchScript model '" + path + "' (property model): " +
                               first_line(e.what()));
    }
    if (!module_.find_method("training_step"))
      throw std::runtime_error("TorchScript model '" + path +
                               "' has no method training_step(latents: Tensor, captions: List[str]) -> Tensor or "
                               "training_step(latents: Tensor, text_embeds: Tensor, text_mask: Tensor) -> Tensor "
                               "(export it with @torch.jit.export)");
    text_ = second_argument_is_tensor("training_step");
    has_validation_ = module_.find_method("validation_step").has_value();
    if (has_validation_ && second_argument_is_tensor("validation_step") != text_)
      throw std::runtime_error("TorchScript model '" + path + "': training_step takes " +
                               (text_ ? "text embeddings" : "captions") + " but validation_step takes " +
                               (text_ ? "captions" : "text embeddings") + "; give both the same conditioning");
    module_.to(device);
    module_.train(true);
  }
  std::string spec() const override { return path_; }
  bool takes_text() const override { return text_; }
  NamedTensors named_parameters() override {
    NamedTensors out;
    for (const auto &p : module_.named_parameters(true)) out.emplace_back(p.name, p.value);
    return out;
  }
  NamedTensors named_buffers() override {
    NamedTensors out;
    for (const auto &b : module_.named_buffers(true)) out.emplace_back(b.name, b.value);
    return out;
  }
  at::Tensor training_step(const ModelInputs &in) override {
    auto out = call("training_step", arguments(in), in);
    if (!out.isTensor()) throw std::runtime_error("training_step of '" + path_ + "' did not return a Tensor");
    return out.toTensor();
  }
  void train(bool on) override { module_.train(on); }
  // validation_step(latents, captions | text_embeds, text_mask, seeds: Tensor[m] int64) -> Tensor
  // ([m] or scalar mean), if exported.
  at::Tensor validation_step(const ModelInputs &in, const std::vector<int64_t> &seeds) override {
    if (!has_validation_) return at::Tensor();
    auto args = arguments(in);
    args.emplace_back(torch::tensor(seeds, torch::kLong));
    auto out = call("validation_step", std::move(args), in);
    if (!out.isTensor()) throw std::runtime_error("validation_step of '" + path_ + "' did not return a Tensor");
    auto t = out.toTensor().to(torch::kFloat);
    const int64_t m = in.latents.size(0);
    if (t.numel() == 1 && m != 1) return t.reshape({1}).expand({m}).clone();
    return t.reshape({-1});
  }
  std::string save(const std::string &dir) override {
    module_.save(dir + "/model.pt");
    return "model.pt";
  }
  void load(const std::string &dir) override {
    auto other = torch::jit::load(dir + "/model.pt", c10::Device(c10::kCPU));
    std::map<std::string, at::Tensor> src;
    for (const auto &p : other.named_parameters(true)) src[p.name] = p.value;
    for (const auto &b : other.named_buffers(true)) src[b.name] = b.value;
    torch::NoGradGuard ng;
    auto copy_all = [&](const NamedTensors &dst) {
      for (const auto &[name, t] : dst) {
        auto it = src.find(name);
        if (it == src.end() || it->second.sizes() != t.sizes())
          throw std::runtime_error("checkpoint '" + dir + "/model.pt' does not match model '" + path_ + "' at " +
                                   name);
        t.copy_(it->second);
      }
    };
    copy_all(named_parameters());
    copy_all(named_buffers());
  }

 private:
  // The conditioning a method takes: (self, latents, Tensor, ...) is the text form.
  bool second_argument_is_tensor(const char *method) {
    const auto &args = module_.get_method(method).function().getSchema().arguments();
    return args.size() > 2 && args[2].type()->kind() == c10::TypeKind::TensorType;
  }
  // A method's failure as the model's own error, where in its source, and what it was given:
  // TorchScript's text opens with a generic line and two tracebacks (see error_message()).
  c10::IValue call(const char *method, std::vector<c10::IValue> args, const ModelInputs &in) {
    try {
      return module_.get_method(method)(std::move(args));
    } catch (const std::exception &e) {
      throw std::runtime_error(std::string(method) + " of TorchScript model '" + path_ + "' failed on " +
                               describe_inputs(in) + ": " + error_message(e.what()));
    }
  }
  static std::string describe_inputs(const ModelInputs &in) {
    std::ostringstream s;
    auto tensor = [&s](const char *name, const at::Tensor &t) {
      s << name << " " << t.sizes() << " " << c10::toString(t.scalar_type());
    };
    tensor("latents", in.latents);
    if (in.has_text()) {
      s << ", ";
      tensor("text_embeds", in.text_embeds);
      s << ", ";
      tensor("text_mask", in.text_mask);
    } else {
      s << ", " << in.captions.size() << " caption(s)";
    }
    return s.str();
  }
  std::vector<c10::IValue> arguments(const ModelInputs &in) const {
    if (text_) return {in.latents, in.text_embeds, in.text_mask};
    return {in.latents, caption_list(in.captions)};
  }

  std::string path_;
  torch::jit::Module module_;
  bool text_ = false, has_validation_ = false;
};

}  // namespace

std::unique_ptr<TrainModel> make_script_model(const std::string &path, const c10::Device &device) {
  return std::make_unique<ScriptModel>(path, device);
}

}  // namespace videotrain
