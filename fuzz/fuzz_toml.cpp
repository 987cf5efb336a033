// libFuzzer target: videotrain-run's TOML reader (tools/toml_subset.cpp): an accepted file has the
// root table first, tables and entries in line order within the file, arrays of one kind; a refused
// one names the line (or says it is not text).
#include <cstddef>
#include <cstdint>
#include <string>

#include "../tools/toml_subset.h"
#include "fuzz_input.h"

using namespace videotrain;

namespace {

int lines_in(const std::string &s) {
  int n = 1;
  for (char c : s) n += c == '\n';
  return n;
}

void check_value(const toml::Value &v, int first, int last) {
  fuzzin::check(v.line >= first && v.line <= last);
  if (v.kind != toml::Value::Kind::Array) return;
  for (const auto &x : v.items) {
    check_value(x, v.line, last);
    bool numbers = (x.kind == toml::Value::Kind::Integer || x.kind == toml::Value::Kind::Float) &&
                   (v.items[0].kind == toml::Value::Kind::Integer || v.items[0].kind == toml::Value::Kind::Float);
    fuzzin::check(x.kind == v.items[0].kind || numbers);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string text(reinterpret_cast<const char *>(data), size);
  toml::Document doc;
  std::string error;
  if (!toml::parse(text, &doc, &error)) {
    fuzzin::check(error.rfind("line ", 0) == 0 || error.rfind("the file holds a NUL byte", 0) == 0);
    return 0;
  }
  const int last = lines_in(text);
  fuzzin::check(!doc.tables.empty() && doc.tables[0].name.empty() && !doc.tables[0].array_item);
  int at = 0;
  for (const auto &t : doc.tables) {
    fuzzin::check(t.line >= at && t.line <= last);
    at = t.line;
    for (const auto &e : t.entries) {
      fuzzin::check(e.line >= at && e.line <= last && e.value.line == e.line);
      check_value(e.value, e.line, last);
      at = e.line;
    }
  }
  return 0;
}
