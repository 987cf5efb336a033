/* TensorBoard event files (tfevents) with scalar summaries, written without
 * TensorFlow or protobuf: TFRecord framing (length, masked CRC-32C of the length,
 * data, masked CRC-32C of the data) around hand-encoded Event messages. No torch. */
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace videotrain {

uint32_t crc32c(const void *data, size_t n, uint32_t crc = 0);
uint32_t masked_crc32c(const void *data, size_t n);

// One serialized Event: wall_time (1), step (2), and either file_version (3) or a
// summary (5) of simple_value scalars.
std::string tf_event_scalars(double wall_time, int64_t step, const std::vector<std::pair<std::string, float>> &scalars);
std::string tf_event_file_version(double wall_time);
// An Event with one image summary (Summary.Value.image: height, width, colorspace, encoded PNG).
std::string tf_event_image(double wall_time, int64_t step, const std::string &tag, const std::string &png,
                           int width, int height, int channels);
// The TFRecord framing of one record.
std::string tf_record(const std::string &data);

class TfEventsWriter {
 public:
  // Creates dir (and parents) and events.out.tfevents.<time>.<host>.<suffix>; false with error.
  bool open(const std::string &dir, const std::string &suffix, std::string *error);
  void add_scalars(int64_t step, const std::vector<std::pair<std::string, float>> &scalars);
  void add_image(int64_t step, const std::string &tag, const std::string &png, int width, int height, int channels);
  void close();
  ~TfEventsWriter() { close(); }
  const std::string &path() const { return path_; }

 private:
  FILE *f_ = nullptr;
  std::string path_;
};

}  // namespace videotrain
