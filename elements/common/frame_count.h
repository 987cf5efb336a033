/* How many frames a video stream really holds, and how long the stream itself lasts.
 *
 * A container's duration is the longest of its tracks (an audio or subtitle track may outlast
 * the video) and a variable-rate stream's nominal rate says little about its frames, so
 * duration x rate can be far off. An MP4/MOV's sample table names every frame: it is read
 * without touching the media data. Other containers (and fragmented MP4s) are demuxed without
 * decoding and the video stream's frames counted. */
#pragma once

#include <cstdint>
#include <string>

namespace videotrain {

struct StreamFrames {
  int64_t frames = 0;     // frames in the video stream
  double duration_s = 0;  // the video stream's own duration (0 = unknown)
  bool from_table = false;  // read from the container's sample table (else counted)
};

// The `video_stream`-th video track of an ISO BMFF file (MP4, MOV, 3GP) from its sample table
// (stsz/stz2 count, stts durations); false when the file is not one or has no usable table
// (fragmented: the samples are in the fragments).
bool sample_table_frames(const std::string &path, int video_stream, StreamFrames *out);

// The sample table where there is one, else a demuxed count (parsebin, no decoding, up to
// timeout_s); false with a reason.
bool count_video_frames(const std::string &path, int video_stream, StreamFrames *out, std::string *why,
                        double timeout_s = 120);

}  // namespace videotrain
