#include "frame_count.h"

#include <gst/gst.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace videotrain {

namespace {

uint32_t be32(const uint8_t *p) { return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3]; }
uint64_t be64(const uint8_t *p) { return uint64_t(be32(p)) << 32 | be32(p + 4); }

// Calls f(type, payload, size) for each box in [p, p + n); false when a box overruns.
bool each_box(const uint8_t *p, size_t n, const std::function<void(const char *, const uint8_t *, size_t)> &f) {
  size_t at = 0;
  while (at + 8 <= n) {
    uint64_t size = be32(p + at);
    size_t head = 8;
    if (size == 1) {
      if (at + 16 > n) return false;
      size = be64(p + at + 8);
      head = 16;
    } else if (size == 0) {
      size = n - at;
    }
    if (size < head || size > n - at) return false;
    char type[5] = {0};
    std::memcpy(type, p + at + 4, 4);
    f(type, p + at + head, size_t(size - head));
    at += size;
  }
  return true;
}

struct Track {
  bool video = false;
  uint32_t timescale = 0;
  int64_t samples = -1;
  uint64_t ticks = 0;  // sum of the sample durations
  bool stts = false;
};

void read_stbl(const uint8_t *p, size_t n, Track *t) {
  each_box(p, n, [&](const char *type, const uint8_t *b, size_t s) {
    if ((!std::strcmp(type, "stsz") && s >= 12) || (!std::strcmp(type, "stz2") && s >= 12)) {
      t->samples = be32(b + 8);
    } else if (!std::strcmp(type, "stts") && s >= 8) {
      const uint64_t entries = be32(b + 4);
      if (8 + entries * 8 > s) return;
      t->stts = true;
      for (uint64_t i = 0; i < entries; i++) t->ticks += uint64_t(be32(b + 8 + i * 8)) * be32(b + 12 + i * 8);
    }
  });
}

Track read_trak(const uint8_t *p, size_t n) {
  Track t;
  each_box(p, n, [&](const char *type, const uint8_t *b, size_t s) {
    if (std::strcmp(type, "mdia")) return;
    each_box(b, s, [&](const char *type2, const uint8_t *c, size_t cs) {
      if (!std::strcmp(type2, "hdlr") && cs >= 12) {
        t.video = std::memcmp(c + 8, "vide", 4) == 0;
      } else if (!std::strcmp(type2, "mdhd") && cs >= 4) {
        const bool v1 = c[0] == 1;
        if (cs >= (v1 ? 24u : 16u)) t.timescale = be32(c + (v1 ? 20 : 12));
      } else if (!std::strcmp(type2, "minf")) {
        each_box(c, cs, [&](const char *type3, const uint8_t *d, size_t ds) {
          if (!std::strcmp(type3, "stbl")) read_stbl(d, ds, &t);
        });
      }
    });
  });
  return t;
}

// The moov box's payload; empty when there is none (or it is implausibly large).
std::vector<uint8_t> read_moov(const std::string &path) {
  std::vector<uint8_t> moov;
  std::unique_ptr<FILE, int (*)(FILE *)> f(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!f) return moov;
  bool first = true;
  for (;;) {
    uint8_t h[16];
    if (std::fread(h, 1, 8, f.get()) != 8) return moov;
    // Every ISO BMFF file starts with ftyp (or, in old MOVs, one of these).
    if (first && std::memcmp(h + 4, "ftyp", 4) && std::memcmp(h + 4, "moov", 4) && std::memcmp(h + 4, "mdat", 4) &&
        std::memcmp(h + 4, "wide", 4) && std::memcmp(h + 4, "free", 4) && std::memcmp(h + 4, "skip", 4))
      return moov;
    first = false;
    uint64_t size = be32(h), head = 8;
    if (size == 1) {
      if (std::fread(h + 8, 1, 8, f.get()) != 8) return moov;
      size = be64(h + 8);
      head = 16;
    }
    if (size == 0 || size < head) return moov;  // to the end of the file (only mdat does that) or broken
    if (!std::memcmp(h + 4, "moov", 4)) {
      if (size - head > (uint64_t(256) << 20)) return moov;
      moov.resize(size_t(size - head));
      if (std::fread(moov.data(), 1, moov.size(), f.get()) != moov.size()) moov.clear();
      return moov;
    }
    if (fseeko(f.get(), off_t(size - head), SEEK_CUR) != 0) return moov;
  }
}

// A demuxed count: parsebin's pads, the chosen video stream's buffers counted, the rest dropped.
struct Counter {
  int want = 0;
  int video_pads = 0;
  bool linked = false;
  std::mutex lock;
  int64_t frames = 0;
  GstClockTime first = GST_CLOCK_TIME_NONE, end = 0;
  GstElement *pipeline = nullptr;
};

GstPadProbeReturn count_buffer(GstPad *, GstPadProbeInfo *info, gpointer data) {
  auto *c = static_cast<Counter *>(data);
  GstBuffer *b = GST_PAD_PROBE_INFO_BUFFER(info);
  std::lock_guard<std::mutex> g(c->lock);
  c->frames++;
  GstClockTime t = GST_BUFFER_PTS_IS_VALID(b) ? GST_BUFFER_PTS(b) : GST_BUFFER_DTS(b);
  if (GST_CLOCK_TIME_IS_VALID(t)) {
    if (!GST_CLOCK_TIME_IS_VALID(c->first) || t < c->first) c->first = t;
    GstClockTime e = t + (GST_BUFFER_DURATION_IS_VALID(b) ? GST_BUFFER_DURATION(b) : 0);
    if (e > c->end) c->end = e;
  }
  return GST_PAD_PROBE_OK;
}

void on_parsed_pad(GstElement *, GstPad *pad, gpointer data) {
  auto *c = static_cast<Counter *>(data);
  GstCaps *caps = gst_pad_get_current_caps(pad);
  if (!caps) caps = gst_pad_query_caps(pad, nullptr);
  const char *name = caps && gst_caps_get_size(caps) ? gst_structure_get_name(gst_caps_get_structure(caps, 0)) : "";
  const bool video = g_str_has_prefix(name, "video/") || g_str_has_prefix(name, "image/");
  if (caps) gst_caps_unref(caps);
  GstElement *sink = gst_element_factory_make("fakesink", nullptr);
  g_object_set(sink, "sync", FALSE, "async", FALSE, nullptr);
  gst_bin_add(GST_BIN(c->pipeline), sink);
  gst_element_sync_state_with_parent(sink);
  GstPad *sinkpad = gst_element_get_static_pad(sink, "sink");
  gst_pad_link(pad, sinkpad);
  gst_object_unref(sinkpad);
  std::lock_guard<std::mutex> g(c->lock);
  if (video && c->video_pads++ == c->want) {
    c->linked = true;
    gst_pad_add_probe(pad, GST_PAD_PROBE_TYPE_BUFFER, count_buffer, c, nullptr);
  }
}

bool demuxed_count(const std::string &path, int video_stream, StreamFrames *out, std::string *why, double timeout_s) {
  Counter c;
  c.want = video_stream;
  c.pipeline = gst_pipeline_new(nullptr);
  GstElement *src = gst_element_factory_make("filesrc", nullptr);
  GstElement *parse = gst_element_factory_make("parsebin", nullptr);
  if (!src || !parse) {
    if (src) gst_object_unref(src);
    if (parse) gst_object_unref(parse);
    gst_object_unref(c.pipeline);
    *why = "missing GStreamer elements filesrc or parsebin (gstreamer1.0-plugins-base)";
    return false;
  }
  g_object_set(src, "location", path.c_str(), nullptr);
  gst_bin_add_many(GST_BIN(c.pipeline), src, parse, nullptr);
  gst_element_link(src, parse);
  g_signal_connect(parse, "pad-added", G_CALLBACK(on_parsed_pad), &c);
  gst_element_set_state(c.pipeline, GST_STATE_PLAYING);
  GstBus *bus = gst_element_get_bus(c.pipeline);
  GstMessage *m = gst_bus_timed_pop_filtered(bus, GstClockTime(timeout_s * GST_SECOND),
                                             GstMessageType(GST_MESSAGE_EOS | GST_MESSAGE_ERROR));
  bool ok = false;
  if (!m) {
    *why = "counting frames took longer than " + std::to_string(int(timeout_s)) + " s";
  } else if (GST_MESSAGE_TYPE(m) == GST_MESSAGE_ERROR) {
    GError *err = nullptr;
    gst_message_parse_error(m, &err, nullptr);
    *why = std::string("cannot demux: ") + (err ? err->message : "unknown error");
    g_clear_error(&err);
  } else {
    ok = true;
  }
  if (m) gst_message_unref(m);
  gst_object_unref(bus);
  gst_element_set_state(c.pipeline, GST_STATE_NULL);
  gst_object_unref(c.pipeline);
  std::lock_guard<std::mutex> g(c.lock);
  if (ok && !c.linked) {
    *why = c.video_pads ? "video stream " + std::to_string(video_stream) + " not found" : std::string("no video stream");
    ok = false;
  }
  if (!ok) return false;
  out->frames = c.frames;
  out->duration_s = GST_CLOCK_TIME_IS_VALID(c.first) && c.end > c.first ? double(c.end - c.first) / GST_SECOND : 0;
  out->from_table = false;
  return true;
}

}  // namespace

bool sample_table_frames(const std::string &path, int video_stream, StreamFrames *out) {
  const std::vector<uint8_t> moov = read_moov(path);
  if (moov.empty()) return false;
  std::vector<Track> videos;
  bool fragmented = false;
  each_box(moov.data(), moov.size(), [&](const char *type, const uint8_t *b, size_t s) {
    if (!std::strcmp(type, "mvex")) fragmented = true;
    if (!std::strcmp(type, "trak")) {
      Track t = read_trak(b, s);
      if (t.video) videos.push_back(t);
    }
  });
  if (fragmented || video_stream < 0 || size_t(video_stream) >= videos.size()) return false;
  const Track &t = videos[size_t(video_stream)];
  if (t.samples <= 0) return false;
  out->frames = t.samples;
  out->duration_s = t.stts && t.timescale ? double(t.ticks) / t.timescale : 0;
  out->from_table = true;
  return true;
}

bool count_video_frames(const std::string &path, int video_stream, StreamFrames *out, std::string *why,
                        double timeout_s) {
  if (sample_table_frames(path, video_stream, out)) return true;
  return demuxed_count(path, video_stream, out, why, timeout_s);
}

}  // namespace videotrain
