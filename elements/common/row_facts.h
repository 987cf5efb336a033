/* Rows whose manifest columns lied, as csvvideosrc learns them from decoding (the video
 * stream's real frame count, the real frame size) and as ranks share them, so that every
 * rank moves such a row to the bucket it fits from the same epoch and plans the same steps.
 * A fact learned from a clip of epoch e counts from epoch e + 1 (see SourceEngine). The text
 * form (one "index epoch frames width height" line a fact) travels through the trainer's c10d
 * store between ranks; no GStreamer or torch here. */
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace videotrain {

struct RowFact {
  uint64_t index = 0;              // manifest index
  uint32_t epoch = 0;              // learned from a clip of this epoch
  int64_t frames = -1;             // the video stream's frame count; -1: not part of this fact
  uint32_t width = 0, height = 0;  // the video's frame size; 0 x 0: not part of this fact

  bool operator<(const RowFact &o) const;
  bool operator==(const RowFact &o) const;
};

std::string format_row_facts(const std::vector<RowFact> &facts);
// Appends the facts of `text` to *out; false (with the line in *why) on a malformed line.
bool parse_row_facts(const std::string &text, std::vector<RowFact> *out, std::string *why);
// Sorted, without repeats: the same list on every rank whatever order facts came in.
void normalise_row_facts(std::vector<RowFact> *facts);

}  // namespace videotrain
