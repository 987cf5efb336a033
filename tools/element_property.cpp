#include "element_property.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>

namespace videotrain {
namespace {

using toml::Value;

size_t edit_distance(const std::string &a, const std::string &b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); j++) row[j] = j;
  for (size_t i = 1; i <= a.size(); i++) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); j++) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// What a property takes, in words, for the error.
std::string describe(GParamSpec *ps) {
  char b[256];
  if (G_IS_PARAM_SPEC_INT(ps)) {
    auto *p = G_PARAM_SPEC_INT(ps);
    std::snprintf(b, sizeof b, "an integer from %d to %d", p->minimum, p->maximum);
  } else if (G_IS_PARAM_SPEC_UINT(ps)) {
    auto *p = G_PARAM_SPEC_UINT(ps);
    std::snprintf(b, sizeof b, "an integer from %u to %u", p->minimum, p->maximum);
  } else if (G_IS_PARAM_SPEC_INT64(ps)) {
    auto *p = G_PARAM_SPEC_INT64(ps);
    std::snprintf(b, sizeof b, "an integer from %" G_GINT64_FORMAT " to %" G_GINT64_FORMAT, p->minimum, p->maximum);
  } else if (G_IS_PARAM_SPEC_UINT64(ps)) {
    auto *p = G_PARAM_SPEC_UINT64(ps);
    std::snprintf(b, sizeof b, "an integer from %" G_GUINT64_FORMAT " to %" G_GUINT64_FORMAT, p->minimum, p->maximum);
  } else if (G_IS_PARAM_SPEC_DOUBLE(ps)) {
    auto *p = G_PARAM_SPEC_DOUBLE(ps);
    std::snprintf(b, sizeof b, "a number from %g to %g", p->minimum, p->maximum);
  } else if (G_IS_PARAM_SPEC_FLOAT(ps)) {
    auto *p = G_PARAM_SPEC_FLOAT(ps);
    std::snprintf(b, sizeof b, "a number from %g to %g", p->minimum, p->maximum);
  } else if (G_IS_PARAM_SPEC_BOOLEAN(ps)) {
    return "true or false";
  } else if (G_IS_PARAM_SPEC_ENUM(ps)) {
    GEnumClass *k = G_PARAM_SPEC_ENUM(ps)->enum_class;
    std::string s = "one of ";
    for (guint i = 0; i < k->n_values; i++) s += std::string(i ? ", " : "") + k->values[i].value_nick;
    return s;
  } else {
    return std::string("a ") + g_type_name(G_PARAM_SPEC_VALUE_TYPE(ps));
  }
  return b;
}

bool settable(GParamSpec *ps) {
  const std::string n = ps->name;
  return (ps->flags & G_PARAM_WRITABLE) && n != "name" && n != "parent";
}

bool scalar_text(const Value &v, std::string *text) {
  switch (v.kind) {
    case Value::Kind::String: *text = v.str; return true;
    case Value::Kind::Bool: *text = v.boolean ? "true" : "false"; return true;
    case Value::Kind::Integer: *text = std::to_string(v.integer); return true;
    case Value::Kind::Float:  // as written (1e-4 stays 1e-4), without TOML's digit separators
      text->clear();
      for (char c : v.source)
        if (c != '_') *text += c;
      return true;
    case Value::Kind::Array: break;
  }
  return false;
}

}  // namespace

std::string did_you_mean(const std::string &key, const std::vector<std::string> &candidates) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto &c : candidates) {
    size_t d = edit_distance(key, c);
    if (d < best_d) best_d = d, best = c;
  }
  if (best.empty() || best_d > std::max<size_t>(2, key.size() / 3)) return "";
  return " (did you mean '" + best + "'?)";
}

bool property_text(GstElement *element, const std::string &key, const Value &value, std::string *text,
                   std::string *why) {
  GObjectClass *klass = G_OBJECT_GET_CLASS(element);
  const std::string factory = GST_OBJECT_NAME(gst_element_get_factory(element));
  GParamSpec *ps = g_object_class_find_property(klass, key.c_str());
  if (!ps || !settable(ps)) {
    guint n = 0;
    GParamSpec **all = g_object_class_list_properties(klass, &n);
    std::vector<std::string> names;
    for (guint i = 0; i < n; i++)
      if (settable(all[i])) names.push_back(all[i]->name);
    g_free(all);
    *why = std::string(" is not ") + (ps ? "a settable" : "a") + " property of " + factory + did_you_mean(key, names) +
           " (gst-inspect-1.0 " + factory + " lists them)";
    return false;
  }
  const GType type = G_PARAM_SPEC_VALUE_TYPE(ps);
  if (value.kind == Value::Kind::Array) {
    if (type != G_TYPE_STRING) {
      *why = " takes one value (" + describe(ps) + "), not an array";
      return false;
    }
    text->clear();
    for (size_t i = 0; i < value.items.size(); i++) {
      std::string item;
      if (!scalar_text(value.items[i], &item)) {
        *why = ": arrays inside arrays are not taken here";
        return false;
      }
      *text += (i ? "," : "") + item;
    }
  } else {
    scalar_text(value, text);
  }
  // videotrain-launch's ranks read pipeline.txt through videotrain-run -f, which substitutes
  // ${VAR} and cuts ' #' comments.
  if (text->find("${") != std::string::npos || text->find(" #") != std::string::npos ||
      text->find("\t#") != std::string::npos || text->find('\n') != std::string::npos) {
    *why = ": a value may not hold '${', a line break or a '#' after a space";
    return false;
  }
  if (type == G_TYPE_STRING) return true;
  GValue v = G_VALUE_INIT;
  g_value_init(&v, type);
  const bool ok = gst_value_deserialize(&v, text->c_str());
  const bool out_of_range = ok && g_param_value_validate(ps, &v);
  g_value_unset(&v);
  if (!ok || out_of_range) {
    *why = ": " + value.source + " is not a value of " + factory + "'s " + key + " (" + describe(ps) + ")";
    return false;
  }
  return true;
}

}  // namespace videotrain
