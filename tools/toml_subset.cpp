#include "toml_subset.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <set>

namespace videotrain::toml {

const char *Value::kind_name() const {
  switch (kind) {
    case Kind::String: return "a string";
    case Kind::Integer: return "an integer";
    case Kind::Float: return "a float";
    case Kind::Bool: return "a boolean";
    case Kind::Array: return "an array";
  }
  return "?";
}

namespace {

struct Parser {
  const std::string &s;
  size_t i = 0;
  int line = 1;
  std::string error;

  explicit Parser(const std::string &text) : s(text) {}

  bool fail(const std::string &what) {
    if (error.empty()) error = "line " + std::to_string(line) + ": " + what;
    return false;
  }
  bool at_end() const { return i >= s.size(); }
  char peek() const { return at_end() ? '\0' : s[i]; }
  void skip_blanks() {
    while (!at_end() && (s[i] == ' ' || s[i] == '\t')) i++;
  }
  void skip_comment() {
    if (peek() == '#')
      while (!at_end() && s[i] != '\n') i++;
  }
  // After a value or header: blanks, a comment, then the end of the line (or file).
  bool end_of_line() {
    skip_blanks();
    skip_comment();
    if (peek() == '\r') i++;
    if (at_end()) return true;
    if (s[i] != '\n') return fail(std::string("unexpected '") + s[i] + "' after the value (one key = value a line)");
    i++;
    line++;
    return true;
  }
  // Inside arrays: blanks, comments and line breaks.
  void skip_space_and_lines() {
    for (;;) {
      skip_blanks();
      skip_comment();
      if (peek() == '\r') i++;
      if (peek() != '\n') return;
      i++;
      line++;
    }
  }

  static bool bare_key_char(char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  }

  bool key(std::string *out) {
    skip_blanks();
    if (peek() == '"' || peek() == '\'') {
      Value v;
      if (!string_value(&v)) return false;
      *out = v.str;
    } else {
      size_t b = i;
      while (!at_end() && bare_key_char(s[i])) i++;
      if (i == b) return fail(at_end() || s[i] == '\n' ? "a key is missing" : std::string("'") + s[i] + "' cannot start a key");
      *out = s.substr(b, i - b);
    }
    skip_blanks();
    if (peek() == '.') return fail("dotted key '" + *out + ".…': write a [table] header instead (not supported here)");
    return true;
  }

  bool hex_escape(int digits, std::string *out) {
    if (i + digits > s.size()) return fail("a \\u escape needs " + std::to_string(digits) + " hex digits");
    uint32_t cp = 0;
    for (int k = 0; k < digits; k++) {
      char c = s[i++];
      int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
      if (d < 0) return fail("a \\u escape needs hex digits");
      cp = cp * 16 + static_cast<uint32_t>(d);
    }
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return fail("the \\u escape is not a Unicode scalar value");
    if (cp < 0x80) {
      *out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      *out += static_cast<char>(0xC0 | (cp >> 6));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      *out += static_cast<char>(0xE0 | (cp >> 12));
      *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      *out += static_cast<char>(0xF0 | (cp >> 18));
      *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return true;
  }

  bool string_value(Value *v) {
    const char q = s[i];
    if (s.compare(i, 3, std::string(3, q)) == 0) return fail("multi-line strings are not supported here");
    i++;
    v->kind = Value::Kind::String;
    std::string out;
    for (;;) {
      if (at_end() || s[i] == '\n') return fail("the string is not closed on its line");
      char c = s[i++];
      if (c == q) break;
      if (q == '"' && c == '\\') {
        if (at_end()) return fail("the string is not closed on its line");
        char e = s[i++];
        switch (e) {
          case '"': out += '"'; break;
          case '\\': out += '\\'; break;
          case 'n': out += '\n'; break;
          case 't': out += '\t'; break;
          case 'r': out += '\r'; break;
          case 'b': out += '\b'; break;
          case 'f': out += '\f'; break;
          case 'u': if (!hex_escape(4, &out)) return false; break;
          case 'U': if (!hex_escape(8, &out)) return false; break;
          default: return fail(std::string("unknown escape \\") + e + " (write \\\\ for a backslash, or use 'single quotes')");
        }
      } else {
        out += c;
      }
    }
    v->str = out;
    return true;
  }

  bool scalar(Value *v) {
    size_t b = i;
    while (!at_end() && s[i] != ',' && s[i] != ']' && s[i] != '#' && s[i] != '\n' && s[i] != '\r' && s[i] != ' ' &&
           s[i] != '\t')
      i++;
    std::string t = s.substr(b, i - b);
    if (t.empty()) return fail(at_end() || s[b] == '\n' ? "a value is missing" : std::string("'") + s[b] + "' cannot start a value");
    if (t == "true" || t == "false") {
      v->kind = Value::Kind::Bool;
      v->boolean = t == "true";
      return true;
    }
    if (t == "inf" || t == "+inf" || t == "-inf" || t == "nan" || t == "+nan" || t == "-nan")
      return fail("'" + t + "' is not a usable number here");
    // Digits with single underscores between them, as TOML writes 1_000.
    std::string n;
    for (size_t k = 0; k < t.size(); k++) {
      if (t[k] == '_') {
        if (k == 0 || k + 1 == t.size() || !isdigit(static_cast<unsigned char>(t[k - 1])) ||
            !isdigit(static_cast<unsigned char>(t[k + 1])))
          return fail("'" + t + "': an underscore must sit between digits");
        continue;
      }
      n += t[k];
    }
    size_t k = (n[0] == '+' || n[0] == '-') ? 1 : 0;
    if (k == n.size() || !isdigit(static_cast<unsigned char>(n[k])))
      return fail("'" + t + "' is not a value (strings are quoted: \"" + t + "\")");
    if (n.size() > k + 1 && n[k] == '0' && isdigit(static_cast<unsigned char>(n[k + 1])))
      return fail("'" + t + "': leading zeros are not allowed");
    bool is_float = n.find_first_of(".eE") != std::string::npos;
    for (char c : n.substr(k))
      if (!isdigit(static_cast<unsigned char>(c)) && c != '.' && c != 'e' && c != 'E' && c != '+' && c != '-')
        return fail("'" + t + "' is not a number" + (t.find(':') != std::string::npos ? " (dates are not supported here)" : "") +
                    " (strings are quoted)");
    errno = 0;
    char *end = nullptr;
    if (is_float) {
      size_t dot = n.find('.');
      if (dot != std::string::npos && (dot + 1 == n.size() || !isdigit(static_cast<unsigned char>(n[dot + 1]))))
        return fail("'" + t + "': a digit must follow the decimal point");
      double d = std::strtod(n.c_str(), &end);
      if (*end || errno == ERANGE || !std::isfinite(d)) return fail("'" + t + "' is not a usable float");
      v->kind = Value::Kind::Float;
      v->number = d;
    } else {
      long long x = std::strtoll(n.c_str(), &end, 10);
      if (*end) return fail("'" + t + "' is not a number (strings are quoted; dates are not supported here)");
      if (errno == ERANGE) return fail("'" + t + "' does not fit a 64-bit integer");
      v->kind = Value::Kind::Integer;
      v->integer = x;
      v->number = static_cast<double>(x);
    }
    return true;
  }

  bool value(Value *v, int depth) {
    skip_blanks();
    v->line = line;
    size_t b = i;
    char c = peek();
    bool ok;
    if (c == '"' || c == '\'') {
      ok = string_value(v);
    } else if (c == '{') {
      return fail("inline tables are not supported here: write a [table] header");
    } else if (c == '[') {
      if (depth > 8) return fail("arrays nested too deeply");
      i++;
      v->kind = Value::Kind::Array;
      for (;;) {
        skip_space_and_lines();
        if (at_end()) return fail("the array is not closed");
        if (s[i] == ']') {
          i++;
          break;
        }
        Value item;
        if (!value(&item, depth + 1)) return false;
        if (!v->items.empty() && item.kind != v->items[0].kind &&
            !(item.kind != Value::Kind::Array && v->items[0].kind != Value::Kind::Array &&
              (item.kind == Value::Kind::Integer || item.kind == Value::Kind::Float) &&
              (v->items[0].kind == Value::Kind::Integer || v->items[0].kind == Value::Kind::Float)))
          return fail(std::string("the array mixes ") + v->items[0].kind_name() + " and " + item.kind_name());
        v->items.push_back(item);
        skip_space_and_lines();
        if (at_end()) return fail("the array is not closed");
        if (peek() == ',') {
          i++;
          continue;
        }
        if (peek() == ']') {
          i++;
          break;
        }
        return fail("expected ',' or ']' in the array");
      }
      ok = true;
    } else {
      ok = scalar(v);
    }
    if (ok) v->source = s.substr(b, i - b);
    return ok;
  }

  bool header(Document *doc, std::set<std::string> *plain_tables, std::set<std::string> *array_tables) {
    const int at = line;
    bool array = s.compare(i, 2, "[[") == 0;
    i += array ? 2 : 1;
    std::string name;
    if (!key(&name)) return false;
    if (array ? s.compare(i, 2, "]]") != 0 : peek() != ']')
      return fail(std::string("the header is not closed with ") + (array ? "]]" : "]"));
    i += array ? 2 : 1;
    if (array) {
      if (plain_tables->count(name)) return fail("[[" + name + "]] after a [" + name + "] table of the same name");
      array_tables->insert(name);
    } else {
      if (array_tables->count(name)) return fail("[" + name + "] after [[" + name + "]] of the same name");
      if (!plain_tables->insert(name).second) return fail("table [" + name + "] is defined twice");
    }
    Table t;
    t.name = name;
    t.array_item = array;
    t.line = at;
    doc->tables.push_back(t);
    return end_of_line();
  }

  bool run(Document *doc) {
    doc->tables.assign(1, Table{});
    std::set<std::string> plain_tables, array_tables;
    if (s.compare(0, 3, "\xEF\xBB\xBF") == 0) i = 3;  // a byte-order mark
    while (!at_end()) {
      skip_blanks();
      skip_comment();
      if (at_end()) break;
      if (s[i] == '\r' || s[i] == '\n') {
        if (!end_of_line()) return false;
        continue;
      }
      if (s[i] == '[') {
        if (!header(doc, &plain_tables, &array_tables)) return false;
        continue;
      }
      Entry e;
      e.line = line;
      if (!key(&e.key)) return false;
      if (peek() != '=') return fail("expected '=' after the key '" + e.key + "'");
      i++;
      if (!value(&e.value, 0)) return false;
      Table &t = doc->tables.back();
      for (const Entry &o : t.entries)
        if (o.key == e.key)
          return fail("'" + e.key + "' is set twice in " + (t.name.empty() ? "the file's top" : "[" + t.name + "]") +
                      " (first on line " + std::to_string(o.line) + ")");
      t.entries.push_back(e);
      if (!end_of_line()) return false;
    }
    return true;
  }
};

}  // namespace

bool parse(const std::string &text, Document *doc, std::string *error) {
  Parser p(text);
  if (text.find('\0') != std::string::npos) {
    *error = "the file holds a NUL byte: not a text file";
    return false;
  }
  if (!p.run(doc)) {
    *error = p.error;
    return false;
  }
  return true;
}

}  // namespace videotrain::toml
