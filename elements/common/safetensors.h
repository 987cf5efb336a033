/* Reading and writing safetensors files (the format diffusers ships weights in).
 *
 * Layout: 8-byte little-endian header length, a JSON header mapping tensor names to
 * {dtype, shape, data_offsets} (plus an optional "__metadata__" string map), then the
 * raw little-endian data. The reader maps the file read-only; no torch here. */
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace videotrain {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;           // "F32", "F16", "BF16", "F64", "I64", "I32", "I16", "I8", "U8", "BOOL"
  std::vector<int64_t> shape;
  const uint8_t *data = nullptr;  // into the mapping; valid while the file object lives
  size_t nbytes = 0;
  uint64_t offset = 0;            // of its bytes in the data section
};

// Bytes per element of a safetensors dtype name; 0 when unknown.
size_t safetensors_dtype_size(const std::string &dtype);

class SafetensorsFile {
 public:
  // Maps and validates the file (header JSON, dtypes, offsets within the file, sizes
  // matching shapes). Returns null with a reason naming the file when anything is off.
  static std::unique_ptr<SafetensorsFile> open(const std::string &path, std::string *error);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile &) = delete;
  SafetensorsFile &operator=(const SafetensorsFile &) = delete;

  const std::string &path() const { return path_; }
  const SafetensorsEntry *find(const std::string &name) const;
  const std::map<std::string, SafetensorsEntry> &entries() const { return entries_; }
  const std::map<std::string, std::string> &metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  void *map_ = nullptr;
  size_t map_size_ = 0;
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

struct SafetensorsOutTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // little-endian, nbytes = numel * dtype size
};

// Writes to `path` through a temporary name and a rename. False with a reason on error.
bool write_safetensors(const std::string &path, const std::vector<SafetensorsOutTensor> &tensors,
                       const std::map<std::string, std::string> &metadata, std::string *error);

// IEEE half / bfloat16 conversions (round to nearest even), for writers and tests.
uint16_t float_to_half(float f);
uint16_t float_to_bfloat16(float f);

}  // namespace videotrain
