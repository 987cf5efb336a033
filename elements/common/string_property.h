/* String properties held as std::string in a settings struct: a NULL set is "", and "" reads back
 * as NULL, the unset value the specs give (gst-inspect shows it as the default). */
#pragma once

#include <glib-object.h>

#include <string>

namespace videotrain {

inline std::string string_property(const GValue *v) {
  const char *s = g_value_get_string(v);
  return s ? s : "";
}

inline void set_string_property(GValue *v, const std::string &s) { g_value_set_string(v, s.empty() ? nullptr : s.c_str()); }

}  // namespace videotrain
