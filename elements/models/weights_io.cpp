#include "weights_io.h"

#include <sys/mman.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

namespace videotrain::models {

namespace {

at::ScalarType dtype_of(const std::string &d) {
  if (d == "F32") return at::kFloat;
  if (d == "F16") return at::kHalf;
  if (d == "BF16") return at::kBFloat16;
  if (d == "F64") return at::kDouble;
  if (d == "I64") return at::kLong;
  if (d == "I32") return at::kInt;
  if (d == "U8") return at::kByte;  // images (videotrain-model forward on an image encoder)
  return at::ScalarType::Undefined;
}

const char *name_of(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "F32";
    case at::kHalf: return "F16";
    case at::kBFloat16: return "BF16";
    default: return "";
  }
}

std::string shape_text(c10::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); i++) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Drops a copied tensor's pages of the read-only shard mapping from this process (they refault from
// the file if read again), so that loading holds the model plus one tensor, not the model and every
// shard's touched pages (a 11 GB umT5-XXL would otherwise count twice in RSS until the folder closes).
void release_pages(const SafetensorsEntry &e) {
  if (e.nbytes == 0) return;
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(e.data) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(e.data) + e.nbytes + page - 1) & ~(page - 1);
  madvise(reinterpret_cast<void *>(begin), end - begin, MADV_DONTNEED);
}

}  // namespace

at::Tensor tensor_of(const SafetensorsEntry &e) {
  const auto dt = dtype_of(e.dtype);
  if (dt == at::ScalarType::Undefined)
    throw std::runtime_error("tensor '" + e.name + "' is " + e.dtype + ", not one of F32, F16, BF16, F64, I64, I32, U8");
  auto t = torch::empty(e.shape, torch::TensorOptions().dtype(dt));
  std::memcpy(t.data_ptr(), e.data, e.nbytes);
  return t;
}

SafetensorsOutTensor out_tensor(const std::string &name, const at::Tensor &t, at::ScalarType dtype) {
  const auto c = t.detach().to(torch::kCPU, dtype).contiguous();
  SafetensorsOutTensor o;
  o.name = name;
  o.dtype = name_of(dtype);
  o.shape = c.sizes().vec();
  o.bytes.resize(c.numel() * c10::elementSize(dtype));
  std::memcpy(o.bytes.data(), c.data_ptr(), o.bytes.size());
  return o;
}

void load_strict(torch::nn::Module &m, const DiffusersFolder &folder, const std::vector<std::string> &optional) {
  std::map<std::string, at::Tensor> wanted;
  for (const auto &p : m.named_parameters(true)) wanted.emplace(p.key(), p.value());
  for (const auto &b : m.named_buffers(true)) wanted.emplace(b.key(), b.value());
  const std::string where = folder.weights_description();
  for (const auto &[name, e] : folder.tensors)
    if (!wanted.count(name))
      throw std::runtime_error("'" + where + "' holds '" + name + "', which this model (" + folder.class_name +
                               ") does not have: another model's weights, or a config.json that does not match them");
  torch::NoGradGuard ng;
  for (auto &[name, t] : wanted) {
    auto it = folder.tensors.find(name);
    if (it == folder.tensors.end()) {
      if (std::find(optional.begin(), optional.end(), name) != optional.end()) continue;
      throw std::runtime_error("'" + where + "' lacks '" + name + "' " + shape_text(t.sizes()) +
                               ", which this model (" + folder.class_name + " of its config.json) needs");
    }
    const SafetensorsEntry &e = *it->second;
    if (e.shape != t.sizes().vec())
      throw std::runtime_error("'" + where + "' holds '" + name + "' as " + shape_text(e.shape) + ", the model (" +
                               folder.class_name + " of its config.json) has " + shape_text(t.sizes()));
    if (!at::isFloatingType(dtype_of(e.dtype)))
      throw std::runtime_error("'" + where + "' holds '" + name + "' as " + e.dtype + "; weights must be F32, F16 or BF16");
    const auto src = tensor_of(e);
    // Named here, where the file is known: later, NaN weights only show as a NaN loss or output.
    if (const int64_t bad = src.numel() - torch::isfinite(src).sum().item<int64_t>(); bad > 0)
      throw std::runtime_error("'" + where + "' holds '" + name + "' with " + std::to_string(bad) + " NaN/Inf of " +
                               std::to_string(src.numel()) +
                               " values: the file is damaged (a failed save, download or conversion); fetch or "
                               "export it again");
    t.copy_(src);
    release_pages(e);
  }
}

bool parse_save_dtype(const std::string &name, at::ScalarType *out) {
  if (name == "bf16" || name == "bfloat16") *out = at::kBFloat16;
  else if (name == "fp16" || name == "float16") *out = at::kHalf;
  else if (name == "fp32" || name == "float32") *out = at::kFloat;
  else return false;
  return true;
}

std::string save_folder(torch::nn::Module &m, const std::string &dir, const std::string &config_json,
                        const std::string &stem, at::ScalarType dtype, uint64_t max_shard_bytes) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw std::runtime_error("cannot create '" + dir + "': " + ec.message());
  {
    const std::string tmp = dir + "/config.json.tmp";
    std::ofstream f(tmp, std::ios::trunc);
    f << config_json;
    f.close();
    if (!f) throw std::runtime_error("cannot write '" + dir + "/config.json'");
    fs::rename(tmp, dir + "/config.json", ec);
    if (ec) throw std::runtime_error("cannot write '" + dir + "/config.json': " + ec.message());
  }
  // Shards in name order (as diffusers' split writes them), each at most max_shard_bytes.
  std::vector<std::pair<std::string, at::Tensor>> all;
  for (const auto &p : m.named_parameters(true)) all.emplace_back(p.key(), p.value());
  for (const auto &b : m.named_buffers(true)) all.emplace_back(b.key(), b.value());
  std::sort(all.begin(), all.end(), [](const auto &a, const auto &b) { return a.first < b.first; });
  const size_t esize = c10::elementSize(dtype);
  std::vector<std::vector<size_t>> shards(1);
  uint64_t in_shard = 0, total = 0;
  for (size_t i = 0; i < all.size(); i++) {
    const uint64_t n = all[i].second.numel() * esize;
    if (!shards.back().empty() && in_shard + n > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += n;
    total += n;
  }
  auto shard_name = [&](size_t k) {
    if (shards.size() == 1) return stem + ".safetensors";
    char buf[64];
    std::snprintf(buf, sizeof buf, "-%05zu-of-%05zu.safetensors", k + 1, shards.size());
    return stem + buf;
  };
  std::map<std::string, std::string> weight_map;
  for (size_t k = 0; k < shards.size(); k++) {
    std::vector<SafetensorsOutTensor> out;
    for (size_t i : shards[k]) {
      out.push_back(out_tensor(all[i].first, all[i].second, dtype));
      weight_map[all[i].first] = shard_name(k);
    }
    std::string err;
    if (!write_safetensors(dir + "/" + shard_name(k), out, {{"format", "pt"}}, &err)) throw std::runtime_error(err);
  }
  if (shards.size() == 1) {
    fs::remove(dir + "/" + stem + ".safetensors.index.json", ec);
    return stem + ".safetensors";
  }
  const std::string index = stem + ".safetensors.index.json";
  std::ofstream f(dir + "/" + index + ".tmp", std::ios::trunc);
  f << shard_index_json(weight_map, total);
  f.close();
  if (!f) throw std::runtime_error("cannot write '" + dir + "/" + index + "'");
  fs::rename(dir + "/" + index + ".tmp", dir + "/" + index, ec);
  if (ec) throw std::runtime_error("cannot write '" + dir + "/" + index + "': " + ec.message());
  fs::remove(dir + "/" + stem + ".safetensors", ec);  // a single file left from before would shadow the index
  return index;
}

}  // namespace videotrain::models
