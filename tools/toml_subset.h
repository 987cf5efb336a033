/* The part of TOML a run config needs, parsed strictly: [tables], [[arrays of tables]],
 * bare or quoted keys, basic and literal strings, integers, floats, booleans and arrays of
 * them (over several lines too), # comments. What it does not take (dotted keys, inline
 * tables, dates, multi-line strings) is an error naming the line, never a silent guess.
 * No GStreamer or torch: videotrain-run's config reader and its tests build on it alone. */
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace videotrain::toml {

struct Value {
  enum class Kind { String, Integer, Float, Bool, Array };
  Kind kind = Kind::String;
  std::string str;  // String: the decoded text
  int64_t integer = 0;
  double number = 0;
  bool boolean = false;
  std::vector<Value> items;  // Array
  int line = 0;
  std::string source;  // as written in the file (for messages and for floats' own spelling)

  const char *kind_name() const;
};

struct Entry {
  std::string key;
  Value value;
  int line = 0;
};

struct Table {
  std::string name;        // "" for the keys before the first header
  bool array_item = false;  // from [[name]]
  int line = 0;            // of its header (0 for the root)
  std::vector<Entry> entries;
};

struct Document {
  std::vector<Table> tables;  // in file order; tables[0] is the root
};

// False and *error "line N: ..." on the first thing that is not this subset of TOML.
bool parse(const std::string &text, Document *doc, std::string *error);

}  // namespace videotrain::toml
