#include "safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "regular_file.h"

namespace videotrain {

size_t safetensors_dtype_size(const std::string &d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

namespace {

std::string shape_text(const std::vector<int64_t> &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); i++) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// The reference implementation's cap: a bigger header is not a weights file.
constexpr uint64_t kMaxHeader = 100'000'000;

// A JSON number that is a non-negative integer, as shapes and offsets must be. Floats are
// refused rather than converted: a cast of 1e30 to an integer is undefined.
bool json_count(const nlohmann::json &v, uint64_t *out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  return false;  // negative integers parse as number_integer, floats as number_float
}

// dtype, shape and data_offsets of one header entry; "" or what is wrong with it. *begin is
// the offset of its bytes in the data section, e->nbytes their count.
std::string parse_entry(const nlohmann::json &v, uint64_t data_size, SafetensorsEntry *e, uint64_t *begin) {
  if (!v.is_object()) return "has a header entry that is not an object";
  auto dtype = v.find("dtype"), shape = v.find("shape"), offsets = v.find("data_offsets");
  if (dtype == v.end() || !dtype->is_string()) return "has no dtype string";
  e->dtype = dtype->get<std::string>();
  size_t esize = safetensors_dtype_size(e->dtype);
  if (esize == 0) return "has unknown dtype '" + e->dtype + "'";
  if (shape == v.end() || !shape->is_array()) return "has no shape array";
  uint64_t nbytes = esize;
  bool overflow = false;
  for (const auto &d : *shape) {
    uint64_t n = 0;
    if (!json_count(d, &n) || n > uint64_t(INT64_MAX)) return "has a shape entry that is not an integer in [0, 2^63)";
    e->shape.push_back(static_cast<int64_t>(n));
    overflow = overflow || __builtin_mul_overflow(nbytes, n, &nbytes);
  }
  uint64_t o[2];
  if (offsets == v.end() || !offsets->is_array() || offsets->size() != 2 || !json_count((*offsets)[0], &o[0]) ||
      !json_count((*offsets)[1], &o[1]))
    return "has no data_offsets [begin, end] of non-negative integers";
  if (o[0] > o[1] || o[1] > data_size)
    return "has data offsets [" + std::to_string(o[0]) + ", " + std::to_string(o[1]) + "] outside the " +
           std::to_string(data_size) + " data bytes of the file";
  // A product that wraps (shape [2^32, 2^32] in 0 bytes) must not pass for a match.
  if (overflow || nbytes != o[1] - o[0])
    return "holds " + std::to_string(o[1] - o[0]) + " bytes, but its shape " + shape_text(e->shape) + " of " +
           e->dtype + " needs " + (overflow ? std::string("more than 2^64") : std::to_string(nbytes));
  *begin = o[0];
  e->nbytes = static_cast<size_t>(o[1] - o[0]);
  return "";
}

}  // namespace

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string &path, std::string *error) {
  auto fail = [&](const std::string &why) -> std::unique_ptr<SafetensorsFile> {
    if (error) *error = path + ": " + why;
    return nullptr;
  };
  // Never blocks on a FIFO, never maps a device: a regular file, with its size.
  RegularFile file;
  std::string why;
  if (!file.open(path, &why)) {
    if (error) *error = "cannot open " + why;
    return nullptr;
  }
  size_t size = static_cast<size_t>(file.size());
  if (size < 8) return fail("too short for a safetensors file (" + std::to_string(size) + " bytes)");
  void *map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, file.fd(), 0);
  file.close();
  if (map == MAP_FAILED) return fail(std::string("cannot map: ") + strerror(errno));

  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->map_ = map;
  f->map_size_ = size;
  const auto *bytes = static_cast<const uint8_t *>(map);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | bytes[i];
  if (hlen > size - 8) return fail("header length " + std::to_string(hlen) + " runs past the end of the file");
  if (hlen > kMaxHeader) return fail("header length " + std::to_string(hlen) + " is over the 100 MB limit");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes + 8, bytes + 8 + hlen);
  } catch (const std::exception &e) {
    return fail(std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) return fail("header is not a JSON object");
  const uint8_t *data = bytes + 8 + hlen;
  size_t data_size = size - 8 - hlen;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) return fail("__metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (m->is_structured()) return fail("__metadata__ value '" + m.key() + "' is not a string");
        f->metadata_[m.key()] = m->is_string() ? m->get<std::string>() : m->dump();
      }
      continue;
    }
    SafetensorsEntry e;
    e.name = it.key();
    uint64_t begin = 0;
    std::string why = parse_entry(*it, data_size, &e, &begin);
    if (!why.empty()) return fail("tensor '" + e.name + "' " + why);
    e.data = data + begin;
    f->entries_[e.name] = std::move(e);
  }
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) munmap(map_, map_size_);
}

const SafetensorsEntry *SafetensorsFile::find(const std::string &name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

bool write_safetensors(const std::string &path, const std::vector<SafetensorsOutTensor> &tensors,
                       const std::map<std::string, std::string> &metadata, std::string *error) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto &t : tensors) {
    uint64_t nbytes = safetensors_dtype_size(t.dtype);
    bool bad = nbytes == 0;
    for (auto d : t.shape) bad = bad || d < 0 || __builtin_mul_overflow(nbytes, static_cast<uint64_t>(d), &nbytes);
    if (bad || nbytes != t.bytes.size()) {
      if (error) *error = "tensor '" + t.name + "': dtype " + t.dtype + " and shape do not match its byte count";
      return false;
    }
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string h = header.dump();
  while (h.size() % 8) h.push_back(' ');  // keeps the data 8-byte aligned
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      if (error) *error = tmp + ": cannot open for writing";
      return false;
    }
    uint64_t n = h.size();
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = static_cast<unsigned char>((n >> (8 * i)) & 0xff);
    out.write(reinterpret_cast<const char *>(len), 8);
    out.write(h.data(), h.size());
    for (const auto &t : tensors) out.write(reinterpret_cast<const char *>(t.bytes.data()), t.bytes.size());
    if (!out.good()) {
      if (error) *error = tmp + ": write failed";
      return false;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    if (error) *error = path + ": cannot rename from " + tmp + ": " + strerror(errno);
    return false;
  }
  return true;
}

uint16_t float_to_bfloat16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((x >> 16) | 0x40);  // NaN stays NaN
  uint32_t rounding = 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

uint16_t float_to_half(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t absx = x & 0x7fffffff;
  if (absx > 0x7f800000) return static_cast<uint16_t>(sign | 0x7e00);
  if (absx >= 0x477ff000) return static_cast<uint16_t>(sign | 0x7c00);  // overflow to inf
  if (absx < 0x38800000) {                                              // subnormal or zero in half
    float af;
    memcpy(&af, &absx, 4);
    // Scale so that the half subnormal unit (2^-24) becomes 1 and round to nearest even.
    float scaled = af * 16777216.0f;
    uint32_t q = static_cast<uint32_t>(scaled);
    float rem = scaled - static_cast<float>(q);
    if (rem > 0.5f || (rem == 0.5f && (q & 1))) q++;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t exp = ((absx >> 23) - 127 + 15) << 10;
  uint32_t mant = absx & 0x7fffff;
  uint32_t h = exp | (mant >> 13);
  uint32_t rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
  return static_cast<uint16_t>(sign | h);
}

}  // namespace videotrain
