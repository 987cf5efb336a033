/* Enum property types of the elements, registered one way (glib-object only, no torch). */
#pragma once

#include <glib-object.h>

#include <string>

/* Defines `static GType fn(void)` registering the GEnum `TypeName` (e.g. "GstVaeEncoderLatent")
 * once, thread-safely, from the GEnumValue entries given: {value, description, nick}, ... */
#define VIDEOTRAIN_DEFINE_ENUM(fn, TypeName, ...)                                               \
  static GType fn(void) {                                                                      \
    static gsize type = 0;                                                                     \
    static const GEnumValue values[] = {__VA_ARGS__, {0, nullptr, nullptr}};                   \
    if (g_once_init_enter(&type)) g_once_init_leave(&type, g_enum_register_static(TypeName, values)); \
    return static_cast<GType>(type);                                                           \
  }

namespace videotrain {

// The nick of `value` in enum `type` ("" for none): for engines whose config holds the nick.
inline std::string enum_nick(GType type, gint value) {
  auto *k = static_cast<GEnumClass *>(g_type_class_ref(type));
  const GEnumValue *v = g_enum_get_value(k, value);
  std::string nick = v ? v->value_nick : "";
  g_type_class_unref(k);
  return nick;
}

// The value of `nick` in enum `type`; `fallback` when no value has that nick.
inline gint enum_value(GType type, const std::string &nick, gint fallback = 0) {
  auto *k = static_cast<GEnumClass *>(g_type_class_ref(type));
  const GEnumValue *v = g_enum_get_value_by_nick(k, nick.c_str());
  const gint r = v ? v->value : fallback;
  g_type_class_unref(k);
  return r;
}

}  // namespace videotrain
