#include "resume_query.h"

extern "C" {

GstQuery *videotrain_resume_query_new(void) {
  return gst_query_new_custom(GST_QUERY_CUSTOM, gst_structure_new_empty(VIDEOTRAIN_RESUME_QUERY_NAME));
}

gboolean videotrain_is_resume_query(GstQuery *query) {
  if (GST_QUERY_TYPE(query) != GST_QUERY_CUSTOM) return FALSE;
  const GstStructure *s = gst_query_get_structure(query);
  return s && gst_structure_has_name(s, VIDEOTRAIN_RESUME_QUERY_NAME);
}

void videotrain_resume_query_answer(GstQuery *query, const VideoTrainResumePosition *pos) {
  GstStructure *s = gst_query_writable_structure(query);
  gst_structure_set(s, "answered", G_TYPE_BOOLEAN, TRUE, "epoch", G_TYPE_UINT, pos->epoch, "clip", G_TYPE_UINT64,
                    pos->clip, "step", G_TYPE_UINT64, pos->step, NULL);
}

gboolean videotrain_resume_query_parse(GstQuery *query, VideoTrainResumePosition *pos) {
  const GstStructure *s = gst_query_get_structure(query);
  gboolean answered = FALSE;
  if (!s || !gst_structure_get_boolean(s, "answered", &answered) || !answered) return FALSE;
  return gst_structure_get_uint(s, "epoch", &pos->epoch) && gst_structure_get_uint64(s, "clip", &pos->clip) &&
         gst_structure_get_uint64(s, "step", &pos->step);
}

void videotrain_resume_query_set_row_facts(GstQuery *query, const gchar *facts) {
  gst_structure_set(gst_query_writable_structure(query), "row-facts", G_TYPE_STRING, facts, NULL);
}

const gchar *videotrain_resume_query_row_facts(GstQuery *query) {
  const GstStructure *s = gst_query_get_structure(query);
  return s ? gst_structure_get_string(s, "row-facts") : NULL;
}

void videotrain_resume_query_set_world_then(GstQuery *query, gint world, const gchar *clips) {
  gst_structure_set(gst_query_writable_structure(query), "world-then", G_TYPE_INT, world, "clips-then", G_TYPE_STRING,
                    clips, NULL);
}

gboolean videotrain_resume_query_world_then(GstQuery *query, gint *world, const gchar **clips) {
  const GstStructure *s = gst_query_get_structure(query);
  if (!s || !gst_structure_get_int(s, "world-then", world)) return FALSE;
  *clips = gst_structure_get_string(s, "clips-then");
  return *clips != NULL;
}

}  // extern "C"
