/* The latent cache's handshake between csvvideosrc and vaeencoder.
 *
 * Before decoding a clip, csvvideosrc sends a custom (non-serialized) query downstream with the
 * clip's identity and the source's part of its cache key; elements in between forward it (queue and
 * GstBaseTransform elements do). vaeencoder answers "cached" when its cache holds the clip under the
 * full key (the source's part, the upstream chain's fingerprint and the encoder's part), and keeps
 * the entry until the clip's turn comes. csvvideosrc then sends, in place of the clip's frames, a
 * serialized custom event with the same identity, and vaeencoder emits the latent there, in order.
 * An element that answers nothing (no vaeencoder, no cache) means "decode". */
#pragma once

#include <gst/gst.h>

#include <cstdint>
#include <string>

#define VIDEOTRAIN_CACHE_QUERY_NAME "videotrain-cache-lookup"
#define VIDEOTRAIN_CACHED_CLIP_EVENT_NAME "videotrain-cached-clip"

namespace videotrain {

// What the source knows of a clip before decoding it (the fields of its clip meta).
struct ClipIdentity {
  uint64_t sample_id = 0;
  unsigned epoch = 0;
  uint64_t clip_index = 0;
  unsigned num_frames = 0;
  int width = 0, height = 0;  // of the frames the source sends (0: not said)
  uint64_t source_frame = 0;
  bool padding = false;
  uint64_t group = 0;        // buckets: the clip's step group, and its size (0: none)
  unsigned group_size = 0;
  std::string caption, path, split;
  std::string source_key;  // content digest, frame window, size and fit: see csvvideosrc
  GstClockTime pts = GST_CLOCK_TIME_NONE, duration = GST_CLOCK_TIME_NONE;  // the event's: the clip's span
};

GstQuery *cache_query_new(const ClipIdentity &clip);
// Asked once at start: does a latent cache answer downstream? Without one, csvvideosrc neither
// asks per clip nor reads videos for their content digests.
GstQuery *cache_probe_query_new();
bool is_cache_probe_query(GstQuery *query);
// True (with the identity) for a cache query.
bool parse_cache_query(GstQuery *query, ClipIdentity *clip);
void answer_cache_query(GstQuery *query, bool cached);
// True when downstream answered that it holds the clip.
bool cache_query_cached(GstQuery *query);

GstEvent *cached_clip_event_new(const ClipIdentity &clip);
bool parse_cached_clip_event(GstEvent *event, ClipIdentity *clip);

// Every element between `sinkpad` and the nearest upstream element made by `stop_factory`, with the
// values of its writable properties, so that another element or setting between source and encoder
// changes the cache key. Queues (they pass buffers unchanged) and properties that cannot change
// pixels (names, thread counts, QoS, silent) are left out.
std::string upstream_chain_fingerprint(GstPad *sinkpad, const char *stop_factory);

}  // namespace videotrain
