/* videotrain-model export (of a step folder or a whole checkpoint-dir, full, partial or LoRA) and
 * info of a LoRA file. */
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "ddptrainsink/checkpoint_store.h"
#include "ddptrainsink/ema_weights.h"
#include "ddptrainsink/param_shards.h"
#include "model_tool.h"
#include "models/diffusers_folder.h"
#include "models/expert_pair.h"
#include "models/lora.h"
#include "models/native_model.h"
#include "models/weights_io.h"

namespace fs = std::filesystem;
using namespace videotrain::models;

namespace videotrain::model_tool {

namespace {

// A checkpoint-dir (step-NNNNNNNN folders): its newest step that verifies, with a line per newer
// one passed over. A step folder itself: as it is.
std::string pick_step(const std::string &dir) {
  std::error_code ec;
  // A step folder, or a diffusers folder (a checkpoint of a full fine-tune is one, too): as it is.
  if (fs::exists(dir + "/trainer.json", ec) || fs::exists(dir + "/config.json", ec)) return dir;
  CheckpointStore store(dir);
  const auto steps = store.step_folders();
  if (steps.empty())
    throw std::runtime_error("'" + dir + "' is neither a model folder or checkpoint (no config.json, no trainer.json) "
                             "nor a checkpoint-dir (no step-NNNNNNNN folders): give a run's checkpoint-dir, one of its "
                             "step folders, or a diffusers transformer folder");
  FoundCheckpoint found;
  const bool ok = store.newest_usable(
      &found, [](const FoundCheckpoint &) { return std::string(); },
      [](const std::string &d, const std::string &why) {
        std::printf("skipping %s: %s\n", d.c_str(), why.c_str());
      });
  if (!ok) throw std::runtime_error("no checkpoint in '" + dir + "' verifies (see above)");
  std::printf("checkpoint-dir %s: newest verified checkpoint %s (step %llu)\n", dir.c_str(), found.dir.c_str(),
              (unsigned long long)found.step);
  return found.dir;
}

nlohmann::json trainer_state(const std::string &step_dir) {
  std::ifstream in(step_dir + "/trainer.json");
  const auto j = nlohmann::json::parse(in, nullptr, false);
  if (!j.is_object()) throw std::runtime_error("'" + step_dir + "/trainer.json' is not a JSON object");
  return j;
}

std::string format_of(std::vector<std::string> &args) {
  const std::string f = opt(args, "--format", "diffusers");
  if (f != "diffusers" && f != "comfyui" && f != "kohya")
    throw std::runtime_error("--format " + f + ": the LoRA namings are diffusers, comfyui and kohya");
  return f;
}

// Known hidden widths, for saying which published model a LoRA fits.
std::string width_name(const std::string &family, int64_t width) {
  static const std::map<std::pair<std::string, int64_t>, const char *> names = {
      {{"wan", 1536}, "Wan 2.1 T2V 1.3B"},
      {{"wan", 3072}, "Wan 2.2 TI2V 5B"},
      {{"wan", 5120}, "Wan 2.1 / 2.2 14B (T2V, I2V, FLF2V)"},
      {{"cogvideox", 1920}, "CogVideoX-2b"},
      {{"cogvideox", 3072}, "CogVideoX-5b / CogVideoX1.5-5B"}};
  const auto it = names.find({family, width});
  return it == names.end() ? std::string("no published model of this width") : it->second;
}

// --ema: the EMA a checkpoint holds (ema.safetensors), by parameter name; each one is taken out as
// it is put in place, so that one left over (a tensor the model lacks) is an error after.
struct EmaTensors {
  std::string path;
  std::map<std::string, at::Tensor> left;
  void put(const std::string &name, at::Tensor &into) {
    const auto it = left.find(name);
    if (it == left.end()) throw std::runtime_error("'" + path + "' has no EMA of '" + name + "'");
    if (it->second.sizes() != into.sizes())
      throw std::runtime_error("'" + path + "' holds the EMA of '" + name + "' in another shape than the checkpoint");
    into.copy_(it->second);
    left.erase(it);
  }
  void all_used() const {
    if (!left.empty())
      throw std::runtime_error("'" + path + "' holds an EMA of '" + left.begin()->first + "', which the checkpoint lacks");
  }
};

EmaTensors ema_of(const std::string &step) {
  std::error_code ec;
  if (!fs::exists(step + "/trainer.json", ec))
    throw std::runtime_error("--ema: '" + step + "' is no checkpoint of a run (no trainer.json): give its checkpoint-dir "
                             "or one of its step folders");
  const std::string file = trainer_state(step).value("ema_file", std::string());
  if (file.empty())
    throw std::runtime_error("--ema: checkpoint '" + step + "' holds no EMA (its run had ema-decay=0); export it without --ema");
  EmaTensors e;
  e.path = step + "/" + file;
  e.left = read_ema_file(e.path);
  return e;
}

// One model's files (`files`: a step folder, or its transformer_2/ for a two-expert run's second
// expert) to `out`. `base` is the base folder of a partial fine-tune, `ema_name` maps a parameter's
// own name to its name in the EMA file (expert 2's carry the transformer_2. prefix).
void export_one(const std::string &step, const std::string &files, const std::string &base, const std::string &out,
                at::ScalarType t, const std::string &dtype, uint64_t shard, const std::string &format, EmaTensors *avg,
                const std::function<std::string(const std::string &)> &ema_name) {
  std::error_code ec;
  const char *what = avg ? "the EMA of " : "";
  if (fs::exists(files + "/pytorch_lora_weights.safetensors", ec)) {
    // A LoRA run's checkpoint: the adapter, in the naming asked for (its own tensors' dtype).
    auto lora = read_lora_file(files + "/pytorch_lora_weights.safetensors");
    if (avg)
      for (auto &[name, m] : lora.modules) {  // PEFT's names, as the trainer's LoRA parameters have them
        avg->put(ema_name("transformer." + name + ".lora_A.weight"), m.a);
        avg->put(ema_name("transformer." + name + ".lora_B.weight"), m.b);
      }
    fs::create_directories(out);
    const std::string name = format == "diffusers" ? "pytorch_lora_weights.safetensors"
                             : format == "comfyui" ? "lora_comfyui.safetensors"
                                                   : "lora_kohya.safetensors";
    write_lora_file(out + "/" + name, lora, format);
    std::printf("exported %sthe LoRA of %s (%zu modules, rank %lld, float32) to %s/%s (%s naming)\n", what,
                files.c_str(), lora.modules.size(), (long long)lora.rank, out.c_str(), name.c_str(), format.c_str());
    return;
  }
  if (fs::exists(files + "/trained_parameters.safetensors", ec)) {
    // A partial fine-tune: the base folder it was trained from, with the trained tensors over it.
    if (base.empty()) throw std::runtime_error("'" + step + "/trainer.json' names no base model");
    auto m = open_dit(base, torch::kCPU);
    std::string err;
    auto f = SafetensorsFile::open(files + "/trained_parameters.safetensors", &err);
    if (!f) throw std::runtime_error(err);
    size_t n = 0;
    for (auto &p : m->module().named_parameters(true))
      if (const auto *e = f->find(p.key())) {
        if (e->shape != p.value().sizes().vec())
          throw std::runtime_error("'" + f->path() + "' holds '" + p.key() + "' in another shape than " + base + "'s");
        p.value().copy_(tensor_of(*e));
        if (avg) avg->put(ema_name(p.key()), p.value());
        n++;
      }
    const std::string file = m->save(out, t, shard);
    std::printf("exported %s%s (%zu trained tensors over %s, %s) to %s/%s\n", what, files.c_str(), n, base.c_str(),
                dtype.c_str(), out.c_str(), file.c_str());
    return;
  }
  auto m = open_dit(files, torch::kCPU);
  if (avg)
    for (auto &p : m->module().named_parameters(true))  // frozen ones have no EMA
      if (avg->left.count(ema_name(p.key()))) avg->put(ema_name(p.key()), p.value());
  const std::string file = m->save(out, t, shard);
  std::printf("exported %s%s (%s) to %s/%s\n", what, files.c_str(), dtype.c_str(), out.c_str(), file.c_str());
}

}  // namespace

int export_command(std::vector<std::string> args) {
  const std::string dtype = opt(args, "--dtype", "bf16");
  const uint64_t shard = std::stoull(opt(args, "--max-shard-bytes", std::to_string(uint64_t(5) << 30)));
  const std::string format = format_of(args);
  const bool ema = flag(args, "--ema");
  at::ScalarType t;
  if (args.size() != 2 || !parse_save_dtype(dtype, &t) || shard == 0) return usage();
  const std::string step = pick_step(args[0]);
  torch::NoGradGuard ng;
  std::error_code ec;
  EmaTensors avg;
  if (ema) avg = ema_of(step);
  const bool has_state = fs::exists(step + "/trainer.json", ec);
  const auto state = has_state ? trainer_state(step) : nlohmann::json::object();
  if (has_state && state.contains("sharding")) {
    // A sharded run's checkpoint (ddptrainsink sharding=optimizer|full): one shard-RRRRR.pt per rank,
    // gathered into the folder the run trained from.
    auto whole = read_sharded_checkpoint(step, state["sharding"]);
    const std::string base = state.value("model", std::string());
    auto m = open_dit(base, torch::kCPU);
    size_t n = 0;
    for (auto &p : m->module().named_parameters(true)) {
      const auto it = whole.find(p.key());
      if (it == whole.end()) continue;
      if (it->second.weight.sizes() != p.value().sizes())
        throw std::runtime_error("'" + step + "' holds '" + p.key() + "' in another shape than " + base + "'s");
      p.value().copy_(it->second.weight);
      if (ema) avg.put(p.key(), p.value());  // rank 0 wrote the run's whole EMA (ema.safetensors)
      whole.erase(it);
      n++;
    }
    if (ema) avg.all_used();
    if (!whole.empty())
      throw std::runtime_error("'" + step + "' holds '" + whole.begin()->first + "', which " + base +
                               " lacks (a LoRA run's shards: its run's own export writes the LoRA)");
    const std::string file = m->save(args[1], t, shard);
    std::printf("exported %s (%zu tensors from the shards of %d ranks, sharding=%s, over %s, %s) to %s/%s\n",
                step.c_str(), n, state["sharding"].value("world", 0),
                state["sharding"].value("mode", std::string()).c_str(), base.c_str(), dtype.c_str(), args[1].c_str(),
                file.c_str());
    return 0;
  }
  export_one(step, step, state.value("model", std::string()), args[1], t, dtype, shard, format, ema ? &avg : nullptr,
             [](const std::string &n) { return n; });
  // A two-expert run (ddptrainsink model-2): the second expert from transformer_2/ to OUT_2, as
  // the run's own export writes transformer/ and transformer_2/.
  const std::string sub = step + "/" + kExpert2Prefix;
  if (has_state && fs::is_directory(sub, ec))
    export_one(step, sub, state.value("model_2", std::string()), expert2_dir(args[1]), t, dtype, shard, format,
               ema ? &avg : nullptr, [](const std::string &n) { return expert2_name(n); });
  if (ema) avg.all_used();
  return 0;
}

int lora_info(const std::string &path) {
  const auto lora = read_lora_file(path);
  std::string err;
  auto f = SafetensorsFile::open(path, &err);
  if (!f) throw std::runtime_error(err);
  std::set<std::string> dtypes;
  for (const auto &[name, e] : f->entries()) dtypes.insert(e.dtype);
  std::string stored;
  for (const auto &d : dtypes) stored += (stored.empty() ? "" : ", ") + d;
  const bool cogvideox = !lora.modules.empty() && lora.modules.begin()->first.rfind("transformer_blocks.", 0) == 0;
  const std::string family = cogvideox ? "cogvideox" : "wan";
  const std::string prefix = cogvideox ? "transformer_blocks." : "blocks.";
  std::map<std::string, int> targets;  // the module's name within a block (or at the top) -> count
  std::set<double> alphas;
  int64_t blocks = 0, width = 0;
  for (const auto &[name, m] : lora.modules) {
    alphas.insert(lora.alpha_of(m));
    std::string kind = name;
    if (name.rfind(prefix, 0) == 0) {
      const size_t dot = name.find('.', prefix.size());
      blocks = std::max<int64_t>(blocks, std::stoll(name.substr(prefix.size(), dot - prefix.size())) + 1);
      kind = name.substr(dot + 1);
      if (kind == "attn1.to_q") width = m.a.size(1);
    }
    targets[kind]++;
  }
  std::printf("LoRA file: %s\nnaming: %s\nstored: %s\nrank: %lld\n", path.c_str(), lora.naming.c_str(),
              stored.c_str(), (long long)lora.rank);
  std::string a;
  for (double x : alphas) a += (a.empty() ? "" : ", ") + std::to_string(x);
  std::printf("alpha: %s (scale alpha / rank)\nmodules: %zu\ntargets:\n", a.c_str(), lora.modules.size());
  for (const auto &[k, n] : targets) std::printf("  %s%s\n", k.c_str(), n > 1 ? ("  (x" + std::to_string(n) + ")").c_str() : "");
  std::printf("fits: a %s transformer with at least %lld blocks", cogvideox ? "CogVideoX" : "Wan", (long long)blocks);
  if (width) std::printf(" and hidden width %lld (%s)", (long long)width, width_name(family, width).c_str());
  std::printf("\n");
  return 0;
}

}  // namespace videotrain::model_tool
