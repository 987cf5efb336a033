/* See bus_message_gst.h. */
#include "bus_message_gst.h"

GST_DEBUG_CATEGORY_STATIC(videotrain_bus_debug);
#define GST_CAT_DEFAULT videotrain_bus_debug

namespace videotrain {

void post_bus_message(GstElement *element, const BusMessage &m) {
  static gsize once = 0;
  if (g_once_init_enter(&once)) {
    GST_DEBUG_CATEGORY_INIT(videotrain_bus_debug, "videotrain-bus", 0, "messages the videotrain engines post");
    g_once_init_leave(&once, 1);
  }
  if (m.is_warning()) {
    auto text = m.strings.find("text");
    GST_ELEMENT_WARNING(element, STREAM, FAILED, ("%s", text == m.strings.end() ? "" : text->second.c_str()),
                        (nullptr));
    return;
  }
  GstStructure *s = gst_structure_new_empty(m.name.c_str());
  for (const auto &[k, v] : m.ints) {
    switch (m.int_type(k)) {
      case BusMessage::IntType::kUint:
        gst_structure_set(s, k.c_str(), G_TYPE_UINT, static_cast<guint>(v), NULL);
        break;
      case BusMessage::IntType::kBoolean:
        gst_structure_set(s, k.c_str(), G_TYPE_BOOLEAN, static_cast<gboolean>(v != 0), NULL);
        break;
      case BusMessage::IntType::kUint64:
        gst_structure_set(s, k.c_str(), G_TYPE_UINT64, static_cast<guint64>(v), NULL);
        break;
    }
  }
  for (const auto &[k, v] : m.numbers) gst_structure_set(s, k.c_str(), G_TYPE_DOUBLE, v, NULL);
  for (const auto &[k, v] : m.strings) gst_structure_set(s, k.c_str(), G_TYPE_STRING, v.c_str(), NULL);
  gst_element_post_message(element, gst_message_new_element(GST_OBJECT(element), s));
}

}  // namespace videotrain
