#include "safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <tuple>
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

// One header entry as the parser saw it: a field that is present but malformed is kept as
// "bad" so that the message says which.
struct RawEntry {
  enum Field { absent, ok, bad };
  Field dtype = absent, shape = absent, offsets = absent;
  std::string dtype_name;
  std::vector<uint64_t> dims, offs;
};

// dtype, shape and data_offsets of one header entry into *e; "" or what is wrong with it.
std::string check_entry(const RawEntry &r, uint64_t data_size, SafetensorsEntry *e) {
  if (r.dtype != RawEntry::ok) return "has no dtype string";
  e->dtype = r.dtype_name;
  size_t esize = safetensors_dtype_size(e->dtype);
  if (esize == 0) return "has unknown dtype '" + e->dtype + "'";
  if (r.shape == RawEntry::absent) return "has no shape array";
  if (r.shape == RawEntry::bad) return "has a shape entry that is not an integer in [0, 2^63)";
  uint64_t nbytes = esize;
  bool overflow = false;
  for (uint64_t n : r.dims) {
    if (n > uint64_t(INT64_MAX)) return "has a shape entry that is not an integer in [0, 2^63)";
    e->shape.push_back(static_cast<int64_t>(n));
    overflow = overflow || __builtin_mul_overflow(nbytes, n, &nbytes);
  }
  if (r.offsets != RawEntry::ok || r.offs.size() != 2)
    return "has no data_offsets [begin, end] of non-negative integers";
  const uint64_t o0 = r.offs[0], o1 = r.offs[1];
  if (o0 > o1 || o1 > data_size)
    return "has data offsets [" + std::to_string(o0) + ", " + std::to_string(o1) + "] outside the " +
           std::to_string(data_size) + " data bytes of the file";
  // A product that wraps (shape [2^32, 2^32] in 0 bytes) must not pass for a match.
  if (overflow || nbytes != o1 - o0)
    return "holds " + std::to_string(o1 - o0) + " bytes, but its shape " + shape_text(e->shape) + " of " +
           e->dtype + " needs " + (overflow ? std::string("more than 2^64") : std::to_string(nbytes));
  e->offset = o0;
  e->nbytes = static_cast<size_t>(o1 - o0);
  return "";
}

// The header read as a stream of SAX events straight into the entry table: a DOM of a 100 MB
// header costs over a gigabyte, the table a few times the header at most.
class HeaderReader : public nlohmann::json_sax<nlohmann::json> {
 public:
  HeaderReader(uint64_t data_size, std::map<std::string, SafetensorsEntry> *entries,
               std::map<std::string, std::string> *metadata)
      : data_size_(data_size), entries_(entries), metadata_(metadata) {}
  const std::string &error() const { return error_; }

  bool null() override { return scalar("null", nullptr); }
  bool boolean(bool v) override { return scalar(v ? "true" : "false", nullptr); }
  bool number_integer(number_integer_t v) override { return scalar(std::to_string(v), nullptr); }
  bool number_unsigned(number_unsigned_t v) override {
    const uint64_t u = v;
    return scalar(std::to_string(v), &u);
  }
  bool number_float(number_float_t, const string_t &s) override { return scalar(s, nullptr); }
  bool string(string_t &v) override {
    if (skip_ == 0 && depth_ == 2 && !in_meta_ && field_ == "dtype") {
      raw_.dtype = RawEntry::ok;
      raw_.dtype_name = v;
      return true;
    }
    return scalar(v, nullptr);
  }
  bool binary(binary_t &) override { return scalar("", nullptr); }
  bool start_object(std::size_t) override { return open(true); }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(false); }
  bool end_array() override { return close(); }
  bool key(string_t &k) override {
    if (skip_ > 0) return true;
    if (depth_ == 1) {
      if (k == "__metadata__" ? seen_meta_ : entries_->count(k) > 0)
        return fail((k == "__metadata__" ? std::string("__metadata__") : "tensor '" + k + "'") +
                    " appears twice in the header");
      name_ = k;
    } else if (depth_ == 2) {
      field_ = k;
      if (in_meta_ && metadata_->count(k)) return fail("__metadata__ key '" + k + "' appears twice");
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string &, const nlohmann::detail::exception &ex) override {
    if (error_.empty()) error_ = std::string("header is not valid JSON: ") + ex.what();
    return false;
  }

 private:
  bool fail(const std::string &why) {
    error_ = why;
    return false;
  }
  // A scalar value at the current place: a metadata value, a shape or offset number, or an
  // unknown field's value (ignored, as the reference reader ignores it).
  bool scalar(const std::string &text, const uint64_t *count) {
    if (skip_ > 0) return true;
    if (depth_ == 0) return fail("header is not a JSON object");
    if (depth_ == 1)
      return fail(name_ == "__metadata__" ? std::string("__metadata__ is not an object")
                                          : "tensor '" + name_ + "' has a header entry that is not an object");
    if (depth_ == 2) {
      if (in_meta_) {
        (*metadata_)[field_] = text;
        return true;
      }
      if (field_ == "dtype") raw_.dtype = RawEntry::bad;
      if (field_ == "shape") raw_.shape = RawEntry::bad;
      if (field_ == "data_offsets") raw_.offsets = RawEntry::bad;
      return true;
    }
    // depth 3: inside the entry's shape or data_offsets array.
    std::vector<uint64_t> &out = field_ == "shape" ? raw_.dims : raw_.offs;
    RawEntry::Field &state = field_ == "shape" ? raw_.shape : raw_.offsets;
    if (count)
      out.push_back(*count);
    else
      state = RawEntry::bad;
    return true;
  }
  bool open(bool object) {
    if (skip_ > 0) {
      skip_++;
      return true;
    }
    if (depth_ == 0) {
      if (!object) return fail("header is not a JSON object");
    } else if (depth_ == 1) {
      if (name_ == "__metadata__") {
        if (!object) return fail("__metadata__ is not an object");
        in_meta_ = seen_meta_ = true;
      } else {
        if (!object) return fail("tensor '" + name_ + "' has a header entry that is not an object");
        raw_ = RawEntry();
      }
    } else if (depth_ == 2) {
      if (in_meta_) return fail("__metadata__ value '" + field_ + "' is not a string");
      const bool list = field_ == "shape" || field_ == "data_offsets";
      if (!list || object) {
        if (field_ == "dtype") raw_.dtype = RawEntry::bad;
        if (list) (field_ == "shape" ? raw_.shape : raw_.offsets) = RawEntry::bad;
        skip_ = 1;  // an unknown field's value, or a malformed one: skipped whole
        return true;
      }
      (field_ == "shape" ? raw_.dims : raw_.offs).clear();
      (field_ == "shape" ? raw_.shape : raw_.offsets) = RawEntry::ok;
    } else {
      (field_ == "shape" ? raw_.shape : raw_.offsets) = RawEntry::bad;  // a nested list
      skip_ = 1;
      return true;
    }
    depth_++;
    return true;
  }
  bool close() {
    if (skip_ > 0) {
      skip_--;
      return true;
    }
    depth_--;
    if (depth_ == 1) {
      if (in_meta_) {
        in_meta_ = false;
        return true;
      }
      SafetensorsEntry e;
      e.name = name_;
      if (std::string why = check_entry(raw_, data_size_, &e); !why.empty())
        return fail("tensor '" + name_ + "' " + why);
      (*entries_)[name_] = std::move(e);
    }
    return true;
  }

  uint64_t data_size_;
  std::map<std::string, SafetensorsEntry> *entries_;
  std::map<std::string, std::string> *metadata_;
  std::string error_, name_, field_;
  RawEntry raw_;
  int depth_ = 0, skip_ = 0;
  bool in_meta_ = false, seen_meta_ = false;
};

// The reference reader's layout rule: the tensors tile the data section exactly, in offset
// order, with no overlap, no gap and nothing after the last. "" or the first breach.
std::string check_tiling(const std::map<std::string, SafetensorsEntry> &entries, uint64_t data_size) {
  std::vector<std::tuple<uint64_t, uint64_t, const std::string *>> spans;
  spans.reserve(entries.size());
  for (const auto &[name, e] : entries) {
    spans.emplace_back(e.offset, e.offset + e.nbytes, &name);
  }
  std::sort(spans.begin(), spans.end());
  uint64_t end = 0;
  const std::string *prev = nullptr;
  for (const auto &[b, e, name] : spans) {
    if (b < end)
      return "tensors '" + *prev + "' and '" + *name + "' overlap in the data section (bytes " + std::to_string(b) +
             " to " + std::to_string(std::min(e, end)) + ")";
    if (b > end)
      return "data bytes " + std::to_string(end) + " to " + std::to_string(b) + " belong to no tensor (before '" +
             *name + "')";
    end = e;
    prev = name;
  }
  if (end != data_size)
    return "data bytes " + std::to_string(end) + " to " + std::to_string(data_size) + " belong to no tensor";
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
  const uint8_t *data = bytes + 8 + hlen;
  const size_t data_size = size - 8 - hlen;
  HeaderReader reader(data_size, &f->entries_, &f->metadata_);
  bool parsed = false;
  try {
    parsed = nlohmann::json::sax_parse(bytes + 8, bytes + 8 + hlen, &reader);
  } catch (const std::exception &e) {
    return fail(std::string("header is not valid JSON: ") + e.what());
  }
  if (!parsed) return fail(reader.error().empty() ? "header is not valid JSON" : reader.error());
  if (std::string why = check_tiling(f->entries_, data_size); !why.empty()) return fail(why);
  for (auto &[name, e] : f->entries_) e.data = data + e.offset;
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
    if (header.contains(t.name)) {  // the header would keep one and the data both: a file readers refuse
      if (error) *error = "tensor '" + t.name + "' is given twice";
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
