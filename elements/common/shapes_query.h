/* The bucket handshake: csvvideosrc with buckets or frame-buckets sends this custom query
 * downstream once at start, listing every clip shape it may emit. vaeencoder checks each (an
 * answer names the first it cannot encode, so that a bad frame-buckets entry fails at start, not
 * clip by clip) and passes the query on; microbatcher answers with its batch-size, which the
 * source takes as the size of its step groups. */
#pragma once

#include <gst/gst.h>

#include <string>
#include <vector>

#define VIDEOTRAIN_SHAPES_QUERY_NAME "videotrain-shapes"

namespace videotrain {

struct ClipShape {
  int width = 0, height = 0, frames = 0;
};

GstQuery *shapes_query_new(const std::vector<ClipShape> &shapes);
// True for a shapes query, with the shapes it lists.
bool parse_shapes_query(GstQuery *query, std::vector<ClipShape> *shapes);
// Keeps the first problem reported.
void shapes_query_set_problem(GstQuery *query, const std::string &problem);
void shapes_query_set_step_samples(GstQuery *query, unsigned samples);
// What downstream said: samples per step (0 when nobody said) and a problem ("" when none).
void shapes_query_result(GstQuery *query, unsigned *step_samples, std::string *problem);

}  // namespace videotrain
