#include "row_facts_query.h"

namespace videotrain {

namespace {
constexpr const char *kName = "videotrain-row-facts";
}

GstQuery *row_facts_query_new(uint32_t epoch, const std::string &mine) {
  return gst_query_new_custom(GST_QUERY_CUSTOM, gst_structure_new(kName, "epoch", G_TYPE_UINT, guint(epoch), "mine",
                                                                   G_TYPE_STRING, mine.c_str(), NULL));
}

bool is_row_facts_query(GstQuery *query) {
  if (GST_QUERY_TYPE(query) != GST_QUERY_CUSTOM) return false;
  const GstStructure *s = gst_query_get_structure(query);
  return s && gst_structure_has_name(s, kName);
}

bool row_facts_query_request(GstQuery *query, uint32_t *epoch, std::string *mine) {
  const GstStructure *s = gst_query_get_structure(query);
  guint e = 0;
  const gchar *m = s ? gst_structure_get_string(s, "mine") : nullptr;
  if (!m || !gst_structure_get_uint(s, "epoch", &e)) return false;
  *epoch = e;
  *mine = m;
  return true;
}

void row_facts_query_answer(GstQuery *query, bool ok, const std::string &text) {
  GstStructure *s = gst_query_writable_structure(query);
  gst_structure_set(s, "agreed", G_TYPE_BOOLEAN, gboolean(ok), "text", G_TYPE_STRING, text.c_str(), NULL);
}

RowFactsReply row_facts_query_reply(GstQuery *query, std::string *text) {
  const GstStructure *s = gst_query_get_structure(query);
  gboolean agreed = FALSE;
  const gchar *t = s ? gst_structure_get_string(s, "text") : nullptr;
  if (!t || !gst_structure_get_boolean(s, "agreed", &agreed)) return RowFactsReply::kNobody;
  *text = t;
  return agreed ? RowFactsReply::kAgreed : RowFactsReply::kFailed;
}

}  // namespace videotrain
