#include "tfevents.h"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>

namespace videotrain {

namespace {

const uint32_t *crc_table() {
  static uint32_t table[256];
  static bool init = [] {
    for (uint32_t i = 0; i < 256; i++) {
      uint32_t c = i;
      for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // Castagnoli, reflected
      table[i] = c;
    }
    return true;
  }();
  (void)init;
  return table;
}

void put_varint(std::string &out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

template <typename T>
void put_fixed(std::string &out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian hosts (x86, arm64)
  out.append(b, sizeof(T));
}

void put_bytes_field(std::string &out, int field, const std::string &bytes) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | 2);
  put_varint(out, bytes.size());
  out += bytes;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t crc32c(const void *data, size_t n, uint32_t crc) {
  const uint32_t *t = crc_table();
  const auto *p = static_cast<const uint8_t *>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; i++) crc = t[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(const void *data, size_t n) {
  uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tf_event_file_version(double wall_time) {
  std::string e;
  e.push_back(0x09);  // wall_time, fixed64
  put_fixed<double>(e, wall_time);
  put_bytes_field(e, 3, "brain.Event:2");
  return e;
}

std::string tf_event_scalars(double wall_time, int64_t step, const std::vector<std::pair<std::string, float>> &scalars) {
  std::string summary;
  for (const auto &[tag, value] : scalars) {
    std::string v;
    put_bytes_field(v, 1, tag);  // Summary.Value.tag
    v.push_back(0x15);           // simple_value (field 2, fixed32)
    put_fixed<float>(v, value);
    put_bytes_field(summary, 1, v);  // Summary.value (repeated)
  }
  std::string e;
  e.push_back(0x09);
  put_fixed<double>(e, wall_time);
  e.push_back(0x10);  // step, varint
  put_varint(e, static_cast<uint64_t>(step));
  put_bytes_field(e, 5, summary);
  return e;
}

std::string tf_event_image(double wall_time, int64_t step, const std::string &tag, const std::string &png,
                           int width, int height, int channels) {
  std::string image;
  image.push_back(0x08);  // Summary.Image.height, varint
  put_varint(image, static_cast<uint64_t>(height));
  image.push_back(0x10);  // width
  put_varint(image, static_cast<uint64_t>(width));
  image.push_back(0x18);  // colorspace: 3 RGB, 4 RGBA
  put_varint(image, static_cast<uint64_t>(channels));
  put_bytes_field(image, 4, png);  // encoded_image_string
  std::string v;
  put_bytes_field(v, 1, tag);    // Summary.Value.tag
  put_bytes_field(v, 4, image);  // Summary.Value.image
  std::string summary;
  put_bytes_field(summary, 1, v);
  std::string e;
  e.push_back(0x09);  // wall_time, fixed64
  put_fixed(e, wall_time);
  e.push_back(0x10);  // step, varint
  put_varint(e, static_cast<uint64_t>(step));
  put_bytes_field(e, 5, summary);
  return e;
}

std::string tf_record(const std::string &data) {
  std::string r;
  uint64_t len = data.size();
  put_fixed<uint64_t>(r, len);
  put_fixed<uint32_t>(r, masked_crc32c(r.data(), 8));
  r += data;
  put_fixed<uint32_t>(r, masked_crc32c(data.data(), data.size()));
  return r;
}

bool TfEventsWriter::open(const std::string &dir, const std::string &suffix, std::string *error) {
  close();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  double t = now_s();
  path_ = dir + "/events.out.tfevents." + std::to_string(static_cast<long long>(t)) + "." + host + suffix;
  f_ = std::fopen(path_.c_str(), "ab");
  if (!f_) {
    if (error) *error = "cannot write TensorBoard events file '" + path_ + "': " + std::strerror(errno);
    return false;
  }
  auto r = tf_record(tf_event_file_version(t));
  std::fwrite(r.data(), 1, r.size(), f_);
  std::fflush(f_);
  return true;
}

void TfEventsWriter::add_scalars(int64_t step, const std::vector<std::pair<std::string, float>> &scalars) {
  if (!f_) return;
  auto r = tf_record(tf_event_scalars(now_s(), step, scalars));
  std::fwrite(r.data(), 1, r.size(), f_);
  std::fflush(f_);
}

void TfEventsWriter::add_image(int64_t step, const std::string &tag, const std::string &png, int width, int height,
                               int channels) {
  if (!f_) return;
  auto r = tf_record(tf_event_image(now_s(), step, tag, png, width, height, channels));
  std::fwrite(r.data(), 1, r.size(), f_);
  std::fflush(f_);
}

void TfEventsWriter::close() {
  if (f_) std::fclose(f_);
  f_ = nullptr;
}

}  // namespace videotrain
