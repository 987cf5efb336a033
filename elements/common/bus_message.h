/* A bus message an engine queues for its face to post (no GStreamer, no torch).
 *
 * The engine knows what each field means, so it also says how the field is typed on the bus
 * (guint64, uint, boolean, double, string); the face posts it with post_bus_message()
 * (bus_message_gst.h) and every element renders fields the same way. Readers, tests among
 * them, look fields up in the three maps by name. */
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace videotrain {

struct BusMessage {
  enum class IntType { kUint64, kUint, kBoolean };

  std::string name;  // element message structure name, or kWarning ("text" holds the warning)
  std::map<std::string, int64_t> ints;
  std::map<std::string, IntType> int_types;  // absent: kUint64
  std::map<std::string, double> numbers;
  std::map<std::string, std::string> strings;

  static constexpr const char *kWarning = "warning";

  explicit BusMessage(std::string message_name = "") : name(std::move(message_name)) {}
  static BusMessage warning(const std::string &text) {
    BusMessage m(kWarning);
    m.strings["text"] = text;
    return m;
  }
  bool is_warning() const { return name == kWarning; }

  BusMessage &set_uint64(const std::string &key, uint64_t v) {
    return set_int(key, static_cast<int64_t>(v), IntType::kUint64);
  }
  BusMessage &set_uint(const std::string &key, uint32_t v) { return set_int(key, v, IntType::kUint); }
  BusMessage &set_bool(const std::string &key, bool v) { return set_int(key, v ? 1 : 0, IntType::kBoolean); }
  BusMessage &set_double(const std::string &key, double v) {
    numbers[key] = v;
    return *this;
  }
  BusMessage &set_string(const std::string &key, const std::string &v) {
    strings[key] = v;
    return *this;
  }
  IntType int_type(const std::string &key) const {
    auto it = int_types.find(key);
    return it == int_types.end() ? IntType::kUint64 : it->second;
  }

 private:
  BusMessage &set_int(const std::string &key, int64_t v, IntType t) {
    ints[key] = v;
    int_types[key] = t;
    return *this;
  }
};

}  // namespace videotrain
