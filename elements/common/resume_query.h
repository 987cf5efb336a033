/* The resume handshake: before csvvideosrc decodes its first clip it sends this
 * custom query downstream; a ddptrainsink resuming from a checkpoint answers with
 * the data position of this rank and the next optimizer step. Elements in between
 * forward it (microbatcher reads the step on the way back). */
#pragma once

#include <gst/gst.h>

G_BEGIN_DECLS

#define VIDEOTRAIN_RESUME_QUERY_NAME "videotrain-resume"

typedef struct {
  guint epoch;       /* epoch to resume at */
  guint64 clip;      /* next clip index of that epoch on this rank */
  guint64 step;      /* next optimizer step number */
} VideoTrainResumePosition;

GstQuery *videotrain_resume_query_new(void);
gboolean videotrain_is_resume_query(GstQuery *query);
/* Answer (the query must be writable, as it is in a pad's query handler). */
void videotrain_resume_query_answer(GstQuery *query, const VideoTrainResumePosition *pos);
/* TRUE when someone answered. */
gboolean videotrain_resume_query_parse(GstQuery *query, VideoTrainResumePosition *pos);
/* The row facts (row_facts.h) the checkpoint holds: set by the trainer after answering; NULL when
 * none were given (owned by the query). */
void videotrain_resume_query_set_row_facts(GstQuery *query, const gchar *facts);
const gchar *videotrain_resume_query_row_facts(GstQuery *query);
/* A checkpoint written by another number of ranks: its world size and every old rank's next clip
 * in the resume epoch ("c0,c1,..."), from which the source finds the global position. */
void videotrain_resume_query_set_world_then(GstQuery *query, gint world, const gchar *clips);
gboolean videotrain_resume_query_world_then(GstQuery *query, gint *world, const gchar **clips);

G_END_DECLS
