/* The bucket handshake: see shapes_query.h. */
#include "shapes_query.h"

namespace videotrain {

GstQuery *shapes_query_new(const std::vector<ClipShape> &shapes) {
  GstStructure *s = gst_structure_new_empty(VIDEOTRAIN_SHAPES_QUERY_NAME);
  GValue list = G_VALUE_INIT;
  gst_value_array_init(&list, guint(shapes.size() * 3));
  for (const ClipShape &c : shapes)
    for (int v : {c.width, c.height, c.frames}) {
      GValue x = G_VALUE_INIT;
      g_value_init(&x, G_TYPE_INT);
      g_value_set_int(&x, v);
      gst_value_array_append_and_take_value(&list, &x);
    }
  gst_structure_take_value(s, "shapes", &list);  // width, height, frames of each shape in turn
  return gst_query_new_custom(GST_QUERY_CUSTOM, s);
}

bool parse_shapes_query(GstQuery *query, std::vector<ClipShape> *shapes) {
  if (GST_QUERY_TYPE(query) != GST_QUERY_CUSTOM) return false;
  const GstStructure *s = gst_query_get_structure(query);
  if (!s || !gst_structure_has_name(s, VIDEOTRAIN_SHAPES_QUERY_NAME)) return false;
  shapes->clear();
  const GValue *list = gst_structure_get_value(s, "shapes");
  if (!list || !GST_VALUE_HOLDS_ARRAY(list)) return true;
  const guint n = gst_value_array_get_size(list);
  for (guint i = 0; i + 2 < n; i += 3) {
    ClipShape c;
    c.width = g_value_get_int(gst_value_array_get_value(list, i));
    c.height = g_value_get_int(gst_value_array_get_value(list, i + 1));
    c.frames = g_value_get_int(gst_value_array_get_value(list, i + 2));
    shapes->push_back(c);
  }
  return true;
}

void shapes_query_set_problem(GstQuery *query, const std::string &problem) {
  GstStructure *s = gst_query_writable_structure(query);
  if (!gst_structure_has_field(s, "problem")) gst_structure_set(s, "problem", G_TYPE_STRING, problem.c_str(), nullptr);
}

void shapes_query_set_step_samples(GstQuery *query, unsigned samples) {
  gst_structure_set(gst_query_writable_structure(query), "step-samples", G_TYPE_UINT, samples, nullptr);
}

void shapes_query_result(GstQuery *query, unsigned *step_samples, std::string *problem) {
  const GstStructure *s = gst_query_get_structure(query);
  guint n = 0;
  if (s) gst_structure_get_uint(s, "step-samples", &n);
  *step_samples = n;
  const char *p = s ? gst_structure_get_string(s, "problem") : nullptr;
  *problem = p ? p : "";
}

}  // namespace videotrain
