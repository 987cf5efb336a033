/* The latent cache handshake: queries and events carry a clip's identity both ways; the upstream
 * chain's fingerprint names what stands between source and encoder and changes with an element's
 * pixel-changing property, but not with queues. */
#include <gst/gst.h>
#include <gtest/gtest.h>

#include <string>

#include "cache_protocol.h"

using namespace videotrain;

TEST(CacheProtocol, QueryAndEventCarryTheClip) {
  ClipIdentity c;
  c.sample_id = 7;
  c.epoch = 2;
  c.clip_index = 5;
  c.num_frames = 9;
  c.source_frame = 30;
  c.padding = true;
  c.caption = "a cat";
  c.path = "/v/a.mp4";
  c.split = "train";
  c.source_key = "video=abc";
  c.pts = 100;
  c.duration = 900;
  GstQuery *q = cache_query_new(c);
  ClipIdentity got;
  ASSERT_TRUE(parse_cache_query(q, &got));
  EXPECT_EQ(got.sample_id, 7u);
  EXPECT_EQ(got.source_key, "video=abc");
  EXPECT_FALSE(cache_query_cached(q));
  answer_cache_query(q, true);
  EXPECT_TRUE(cache_query_cached(q));
  gst_query_unref(q);
  GstEvent *e = cached_clip_event_new(c);
  ASSERT_TRUE(parse_cached_clip_event(e, &got));
  EXPECT_EQ(got.clip_index, 5u);
  EXPECT_EQ(got.epoch, 2u);
  EXPECT_EQ(got.num_frames, 9u);
  EXPECT_TRUE(got.padding);
  EXPECT_EQ(got.caption, "a cat");
  EXPECT_EQ(got.pts, 100u);
  EXPECT_EQ(got.duration, 900u);
  gst_event_unref(e);
}

namespace {
std::string fingerprint_of(const char *description) {
  GError *err = nullptr;
  GstElement *p = gst_parse_launch(description, &err);
  EXPECT_TRUE(p) << (err ? err->message : "");
  if (!p) return "";
  // As vaeencoder sees it: while data flows (videoflip applies its method at negotiation).
  gst_element_set_state(p, GST_STATE_PAUSED);
  gst_element_get_state(p, nullptr, nullptr, 10 * GST_SECOND);
  GstElement *sink = gst_bin_get_by_name(GST_BIN(p), "end");
  GstPad *pad = gst_element_get_static_pad(sink, "sink");
  std::string f = upstream_chain_fingerprint(pad, "videotestsrc");
  gst_object_unref(pad);
  gst_object_unref(sink);
  gst_element_set_state(p, GST_STATE_NULL);
  gst_object_unref(p);
  return f;
}
}  // namespace

TEST(CacheProtocol, ChainFingerprintFollowsPixelChangingElements) {
  gst_init(nullptr, nullptr);
  const std::string plain = fingerprint_of("videotestsrc ! queue ! fakesink name=end");
  EXPECT_EQ(plain, "");
  EXPECT_EQ(fingerprint_of("videotestsrc ! queue max-size-buffers=3 ! queue2 ! fakesink name=end"), plain);
  const std::string flip = fingerprint_of("videotestsrc ! videoflip video-direction=90r ! queue ! fakesink name=end");
  EXPECT_NE(flip.find("videoflip("), std::string::npos) << flip;
  EXPECT_NE(flip, fingerprint_of("videotestsrc ! videoflip video-direction=horiz ! queue ! fakesink name=end"));
  const std::string conv = fingerprint_of("videotestsrc ! videoconvert ! fakesink name=end");
  EXPECT_EQ(conv, fingerprint_of("videotestsrc ! videoconvert n-threads=4 ! fakesink name=end"));
  EXPECT_NE(conv, fingerprint_of("videotestsrc ! videoconvert dither=none ! fakesink name=end"));
  EXPECT_NE(fingerprint_of("videotestsrc ! videobalance ! fakesink name=end"),
            fingerprint_of("videotestsrc ! videobalance saturation=0.5 ! fakesink name=end"));
}
