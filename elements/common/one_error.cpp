#include "one_error.h"

#include <cstring>

namespace {

GQuark posted_quark() {
  static const GQuark q = g_quark_from_static_string("videotrain-error-posted");
  return q;
}

gboolean filtered_post_message(GstElement *element, GstMessage *message);

// The nearest ancestor class whose post_message is not this filter.
GstElementClass *parent_of(GstElement *element) {
  auto *k = GST_ELEMENT_GET_CLASS(element);
  while (k && k->post_message == filtered_post_message) k = GST_ELEMENT_CLASS(g_type_class_peek_parent(k));
  return k;
}

gboolean filtered_post_message(GstElement *element, GstMessage *message) {
  if (GST_MESSAGE_TYPE(message) == GST_MESSAGE_ERROR && GST_MESSAGE_SRC(message) == GST_OBJECT(element)) {
    GError *err = nullptr;
    gchar *debug = nullptr;
    gst_message_parse_error(message, &err, &debug);
    const bool fallback = err && err->domain == GST_CORE_ERROR && err->code == GST_CORE_ERROR_STATE_CHANGE &&
                          debug && std::strstr(debug, "Failed to start");
    g_clear_error(&err);
    g_free(debug);
    if (fallback && g_object_get_qdata(G_OBJECT(element), posted_quark())) {
      GST_DEBUG_OBJECT(element, "dropping the base class's fallback error: the reason was posted already");
      g_object_set_qdata(G_OBJECT(element), posted_quark(), nullptr);
      gst_message_unref(message);
      return FALSE;
    }
    if (!fallback) g_object_set_qdata(G_OBJECT(element), posted_quark(), GINT_TO_POINTER(1));
  } else if (GST_MESSAGE_TYPE(message) == GST_MESSAGE_STATE_CHANGED && GST_MESSAGE_SRC(message) == GST_OBJECT(element)) {
    GstState old_state, new_state;
    gst_message_parse_state_changed(message, &old_state, &new_state, nullptr);
    if (old_state == GST_STATE_NULL) g_object_set_qdata(G_OBJECT(element), posted_quark(), nullptr);  // a new start
  }
  GstElementClass *parent = parent_of(element);
  if (parent && parent->post_message) return parent->post_message(element, message);
  gst_message_unref(message);
  return FALSE;
}

}  // namespace

extern "C" void videotrain_one_error_install(GstElementClass *klass) { klass->post_message = filtered_post_message; }
