/* Decodes the frames of one clip from one video file with its own GStreamer chain
 * (filesrc ! decodebin ! videocrop ! videoscale ! videoconvert (repacking only) ! appsink,
 * then YuvToRgb in the stream's own colour): seeks to the keyframe before the clip
 * (accurate seek), decodes to the clip's last frame, stops. The chain runs on a thread of
 * its own so that a read that blocks cannot hold up the caller. */
#pragma once

#include <gst/gst.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace videotrain {

// Part of every latent cache key: change it whenever decoding, colour conversion or resizing
// changes the pixels a clip gets, so that caches filled before miss.
constexpr const char *kDecodeVersion = "decode-2";

enum class ClipStart { Random, Start, Center };
enum class ResizeMode { Crop, Pad, Stretch };

struct ClipRequest {
  std::string path;
  int num_frames = 49;
  int stride = 1;           // every stride-th decoded frame (when fps is 0)
  double fps = 0;           // > 0: frames at this rate of source time, chosen by timestamps
  int video_stream = 0;     // index among the file's video streams
  double source_fps = 0;    // the video's rate where the stream gives none (manifest's fps column)
  ClipStart start = ClipStart::Random;
  uint64_t random_key = 0;  // seeds the random start
  int width = 720, height = 480;
  ResizeMode resize = ResizeMode::Crop;
  bool pad_short = false;   // repeat the last frame of a short video instead of failing
  int decode_threads = 1;   // 0 = decoder's automatic choice
  double timeout_s = 60.0;  // whole clip, preroll included
  int64_t known_frames = -1;  // the stream's real frame count where an earlier decode found it
  int64_t manifest_frames = 0;  // the manifest's num_frames (0: none): a count of the video stream
                                // itself, where the container's duration may cover a longer audio track
};

enum class DecodeStatus { Ok, Failed, Short, Timeout, Cancelled };

struct DecodedClip {
  std::vector<GstBuffer *> frames;     // RGB, width x height, owned
  std::vector<uint64_t> source_frames;  // frame number in the source of each frame
  uint64_t frames_decoded = 0;          // frames that left the decoder (incl. those skipped)
  int64_t total_frames = -1;            // estimated frames in the video, -1 unknown
  int64_t real_frames = -1;             // the stream ended before the estimate: its frames, else -1
  std::string stream;                   // "video stream 0 of 2, 320x180, BT.709 limited range"
  int source_width = 0, source_height = 0;  // the decoded stream's own size
  uint64_t start_time = 0;              // fps > 0: time of the first sample in the source, ns
  DecodedClip() = default;
  DecodedClip(const DecodedClip &) = delete;
  DecodedClip &operator=(const DecodedClip &) = delete;
  DecodedClip(DecodedClip &&o) noexcept;
  DecodedClip &operator=(DecodedClip &&o) noexcept;
  ~DecodedClip();
  void clear();
};

// Blocking; returns promptly (Cancelled) when *cancel becomes true, and about a second after
// timeout_s even when the chain is stuck in a call that does not return (a read or open of a
// stalled mount or pipe): such a chain is abandoned on its own thread, never waited for, and
// frees itself when the call returns.
DecodeStatus decode_clip(const ClipRequest &req, const std::atomic<bool> *cancel, DecodedClip *out,
                         std::string *reason);

struct AbandonedChains {
  uint64_t total = 0;    // chains left behind since the process started
  uint64_t running = 0;  // of those, still stuck
};
AbandonedChains abandoned_chains();

const char *decode_status_name(DecodeStatus s);

}  // namespace videotrain
