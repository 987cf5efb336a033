#include "clip_decoder.h"

#include "frame_count.h"

#include "yuv_to_rgb.h"

#include <gst/app/gstappsink.h>
#include <gst/video/video.h>

#include <glib/gstdio.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>

GST_DEBUG_CATEGORY_STATIC(clip_decoder_debug);
#define GST_CAT_DEFAULT clip_decoder_debug

namespace videotrain {

namespace {

using Clock = std::chrono::steady_clock;
constexpr GstClockTime kSlice = 50 * GST_MSECOND;  // how often waits look at cancel/deadline
constexpr gint64 kStallUs = 3 * G_USEC_PER_SEC;     // no read and no stream found: the demuxer gave up
// A chain that has not answered this long after its deadline, or has not stopped this long
// after its result, is stuck in a call that does not return (a read or open that blocks).
constexpr auto kAnswerSlack = std::chrono::seconds(1);
constexpr auto kStopGrace = std::chrono::seconds(1);

std::atomic<uint64_t> abandoned_total{0}, abandoned_running{0};

void init_debug() {
  static std::once_flag once;
  std::call_once(once, [] {
    GST_DEBUG_CATEGORY_INIT(clip_decoder_debug, "csvvideosrc-decoder", 0, "csvvideosrc per-video decoding chains");
  });
}

// State shared with the decodebin callbacks (streaming threads).
struct Chain {
  GstElement *pipeline = nullptr;
  GstElement *src = nullptr;
  GstElement *crop = nullptr;
  GstElement *sink = nullptr;
  const ClipRequest *req = nullptr;  // outlives the chain (the Job's copy)
  std::mutex lock;
  bool linked = false;
  bool no_more_pads = false;
  int fps_n = 0, fps_d = 1;
  int video_pads = 0;                            // video streams decodebin exposed so far
  int width = 0, height = 0;                     // of the chosen stream
  Colour colour;                                 // of the chosen stream
  std::map<std::string, std::string> container;  // stream-id -> the demuxer's colorimetry
  std::atomic<uint64_t> decoded{0};
  std::atomic<gint64> last_read{0};  // monotonic time of the last read from the file

  ~Chain() {
    if (pipeline) {
      gst_element_set_state(pipeline, GST_STATE_NULL);
      gst_object_unref(pipeline);
    }
  }
};

// Centre crop (in source pixels) that gives the output's aspect ratio.
void set_crop(GstElement *crop, const GstVideoInfo &vi, int out_w, int out_h) {
  double par = vi.par_d > 0 && vi.par_n > 0 ? double(vi.par_n) / vi.par_d : 1.0;
  double src_aspect = vi.width * par / vi.height;
  double dst_aspect = double(out_w) / out_h;
  int left = 0, right = 0, top = 0, bottom = 0;
  if (src_aspect > dst_aspect) {
    int keep = int(std::lround(vi.height * dst_aspect / par));
    int cut = vi.width - keep;
    if (cut > 0) left = cut / 2, right = cut - cut / 2;
  } else {
    int keep = int(std::lround(vi.width * par / dst_aspect));
    int cut = vi.height - keep;
    if (cut > 0) top = cut / 2, bottom = cut - cut / 2;
  }
  g_object_set(crop, "left", left, "right", right, "top", top, "bottom", bottom, nullptr);
}

// A stream (a pipe) read in push mode whose task still runs is waiting in read(), which
// is a stall for decode-timeout to judge, not a demuxer that gave up.
bool read_may_block(const Chain &c) {
  GstPad *pad = gst_element_get_static_pad(c.src, "src");
  bool running = GST_PAD_MODE(pad) == GST_PAD_MODE_PUSH && gst_pad_get_task_state(pad) == GST_TASK_STARTED;
  gst_object_unref(pad);
  return running;
}

GstPadProbeReturn note_read(GstPad *, GstPadProbeInfo *, gpointer data) {
  static_cast<Chain *>(data)->last_read = g_get_monotonic_time();
  return GST_PAD_PROBE_OK;
}

GstPadProbeReturn count_frames(GstPad *, GstPadProbeInfo *info, gpointer data) {
  if (GST_PAD_PROBE_INFO_TYPE(info) & GST_PAD_PROBE_TYPE_BUFFER) static_cast<Chain *>(data)->decoded++;
  return GST_PAD_PROBE_OK;
}

std::string stream_id(GstPad *pad) {
  gchar *id = gst_pad_get_stream_id(pad);
  std::string out = id ? id : "";
  g_free(id);
  return out;
}

// On the sink of a video parser, or of a decoder fed straight from the demuxer: the
// colorimetry a container gives is put aside and taken out of the caps, so that the parser
// and decoder report the bitstream's own (as ffmpeg prefers it). A container's is wrong at
// times: GStreamer 1.22's qtdemux reads an MP4 'colr' box of a full-range video as limited.
GstPadProbeReturn strip_container_colour(GstPad *pad, GstPadProbeInfo *info, gpointer data) {
  GstEvent *ev = GST_PAD_PROBE_INFO_EVENT(info);
  if (GST_EVENT_TYPE(ev) != GST_EVENT_CAPS) return GST_PAD_PROBE_OK;
  GstCaps *caps;
  gst_event_parse_caps(ev, &caps);
  const GstStructure *st = gst_caps_get_structure(caps, 0);
  const char *colour = st ? gst_structure_get_string(st, "colorimetry") : nullptr;
  gboolean parsed = FALSE;
  if (!colour || (gst_structure_get_boolean(st, "parsed", &parsed) && parsed)) return GST_PAD_PROBE_OK;
  auto *c = static_cast<Chain *>(data);
  {
    std::lock_guard<std::mutex> g(c->lock);
    c->container.emplace(stream_id(pad), colour);  // the first seen is the container's
  }
  GstCaps *bare = gst_caps_copy(caps);
  gst_structure_remove_field(gst_caps_get_structure(bare, 0), "colorimetry");
  GstEvent *out = gst_event_new_caps(bare);
  gst_caps_unref(bare);
  gst_event_unref(ev);
  GST_PAD_PROBE_INFO_DATA(info) = out;
  return GST_PAD_PROBE_OK;
}

void on_pad_added(GstElement *, GstPad *pad, gpointer data) {
  auto *c = static_cast<Chain *>(data);
  GstCaps *caps = gst_pad_get_current_caps(pad);
  if (!caps) caps = gst_pad_query_caps(pad, nullptr);
  GstVideoInfo vi;
  bool is_video = caps && g_str_has_prefix(gst_structure_get_name(gst_caps_get_structure(caps, 0)), "video/x-raw") &&
                  gst_video_info_from_caps(&vi, caps);
  std::string decoded_colour;
  if (is_video) {
    const char *s = gst_structure_get_string(gst_caps_get_structure(caps, 0), "colorimetry");
    if (s) decoded_colour = s;
  }
  if (caps) gst_caps_unref(caps);
  std::lock_guard<std::mutex> g(c->lock);
  if (!is_video) return;  // audio is left unlinked
  // decodebin exposes the video streams in the file's order; the others are left unlinked.
  if (c->video_pads++ != c->req->video_stream) return;
  c->fps_n = vi.fps_n;
  c->fps_d = vi.fps_d > 0 ? vi.fps_d : 1;
  c->width = vi.width;
  c->height = vi.height;
  auto it = c->container.find(stream_id(pad));
  c->colour = resolve_colour(decoded_colour.empty() ? nullptr : decoded_colour.c_str(),
                             it == c->container.end() ? nullptr : it->second.c_str());
  if (c->req->resize == ResizeMode::Crop) set_crop(c->crop, vi, c->req->width, c->req->height);
  GstPad *sinkpad = gst_element_get_static_pad(c->crop, "sink");
  if (gst_pad_link(pad, sinkpad) == GST_PAD_LINK_OK) {
    c->linked = true;
    gst_pad_add_probe(pad, GST_PAD_PROBE_TYPE_BUFFER, count_frames, c, nullptr);
  }
  gst_object_unref(sinkpad);
}

void on_no_more_pads(GstElement *, gpointer data) {
  auto *c = static_cast<Chain *>(data);
  std::lock_guard<std::mutex> g(c->lock);
  c->no_more_pads = true;
}

// Threads per decoder: gst-libav decoders have max-threads (0 = auto).
// Video parsers and decoders: the container's colorimetry is put aside on their input.
void on_element_added(GstBin *, GstBin *, GstElement *element, gpointer data) {
  auto *c = static_cast<Chain *>(data);
  if (g_object_class_find_property(G_OBJECT_GET_CLASS(element), "max-threads"))
    g_object_set(element, "max-threads", c->req->decode_threads, nullptr);
  GstElementFactory *f = gst_element_get_factory(element);
  const char *klass = f ? gst_element_factory_get_metadata(f, GST_ELEMENT_METADATA_KLASS) : nullptr;
  if (klass && strstr(klass, "Video") && (strstr(klass, "Parser") || strstr(klass, "Decoder"))) {
    if (GstPad *sink = gst_element_get_static_pad(element, "sink")) {
      gst_pad_add_probe(sink, GST_PAD_PROBE_TYPE_EVENT_DOWNSTREAM, strip_container_colour, c, nullptr);
      gst_object_unref(sink);
    }
  }
}

GstElement *make(const char *factory, GstElement *bin) {
  GstElement *e = gst_element_factory_make(factory, nullptr);
  if (e) gst_bin_add(GST_BIN(bin), e);
  return e;
}

// The first error on the pipeline's bus, "" when none; `wait` gives a failing element's streaming
// thread time to post its error (a state change can be seen failing before its reason arrives,
// which made the same corrupt file read "state change failed" on one rank and "Could not
// determine type of stream" on another).
std::string bus_error(GstElement *pipeline, GstClockTime wait = 0) {
  GstBus *bus = gst_element_get_bus(pipeline);
  std::string out;
  for (GstMessage *m = gst_bus_timed_pop_filtered(bus, wait, GST_MESSAGE_ERROR); m;
       m = gst_bus_pop_filtered(bus, GST_MESSAGE_ERROR)) {
    if (out.empty()) {
      GError *e = nullptr;
      gst_message_parse_error(m, &e, nullptr);
      out = e ? e->message : "unknown decoding error";
      g_clear_error(&e);
    }
    gst_message_unref(m);
  }
  gst_object_unref(bus);
  return out;
}

}  // namespace

DecodedClip::DecodedClip(DecodedClip &&o) noexcept { *this = std::move(o); }

DecodedClip &DecodedClip::operator=(DecodedClip &&o) noexcept {
  if (this != &o) {
    clear();
    frames = std::move(o.frames);
    source_frames = std::move(o.source_frames);
    frames_decoded = o.frames_decoded;
    total_frames = o.total_frames;
    real_frames = o.real_frames;
    stream = std::move(o.stream);
    source_width = o.source_width;
    source_height = o.source_height;
    start_time = o.start_time;
    o.frames.clear();
  }
  return *this;
}

DecodedClip::~DecodedClip() { clear(); }

void DecodedClip::clear() {
  for (GstBuffer *b : frames)
    if (b) gst_buffer_unref(b);
  frames.clear();
  source_frames.clear();
}

AbandonedChains abandoned_chains() { return {abandoned_total.load(), abandoned_running.load()}; }

const char *decode_status_name(DecodeStatus s) {
  switch (s) {
    case DecodeStatus::Ok: return "ok";
    case DecodeStatus::Failed: return "failed";
    case DecodeStatus::Short: return "short";
    case DecodeStatus::Timeout: return "timeout";
    case DecodeStatus::Cancelled: return "cancelled";
  }
  return "?";
}

namespace {

// One clip decoded with chain `c` (whose req is set), in named steps that share the clip's
// state; the caller tears the chain down.
class ClipDecode {
 public:
  ClipDecode(Chain &c, const std::atomic<bool> *cancel, DecodedClip *out, std::string *reason)
      : c_(c), req_(*c.req), cancel_(cancel), out_(out), reason_(reason),
        deadline_(Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(req_.timeout_s))),
        by_time_(req_.fps > 0) {}
  ~ClipDecode() {
    drop_prev();
    if (conv_caps_) gst_caps_unref(conv_caps_);
  }
  ClipDecode(const ClipDecode &) = delete;
  ClipDecode &operator=(const ClipDecode &) = delete;

  DecodeStatus run() {
    out_->clear();
    DecodeStatus s;
    if ((s = check_file()) != DecodeStatus::Ok || (s = build_chain()) != DecodeStatus::Ok ||
        (s = preroll()) != DecodeStatus::Ok)
      return s;
    read_stream_facts();
    if ((s = place_clip()) != DecodeStatus::Ok || (s = pull_frames()) != DecodeStatus::Ok) return s;
    return pad_short();
  }

 private:
  bool timed_out() const { return Clock::now() >= deadline_; }
  bool cancelled() const { return cancel_ && cancel_->load(); }
  DecodeStatus fail(DecodeStatus s, std::string why) {
    *reason_ = std::move(why);
    return s;
  }

  DecodeStatus check_file() {
    if (!g_file_test(req_.path.c_str(), G_FILE_TEST_EXISTS)) return fail(DecodeStatus::Failed, "file not found");
    // A named pipe is read as a stream (clip-start=start; no seeks).
    GStatBuf st;
    if (!g_file_test(req_.path.c_str(), G_FILE_TEST_IS_REGULAR) &&
        !(g_stat(req_.path.c_str(), &st) == 0 && S_ISFIFO(st.st_mode)))
      return fail(DecodeStatus::Failed, "not a regular file");
    return DecodeStatus::Ok;
  }

  // filesrc ! decodebin, then (linked when the stream appears) videocrop ! videoscale !
  // capsfilter ! videoconvert ! capsfilter ! appsink.
  DecodeStatus build_chain() {
    c_.pipeline = gst_pipeline_new(nullptr);
    GstElement *src = c_.src = make("filesrc", c_.pipeline);
    GstElement *dec = make("decodebin", c_.pipeline);
    c_.crop = make("videocrop", c_.pipeline);
    GstElement *scale = make("videoscale", c_.pipeline);
    GstElement *sizecaps = make("capsfilter", c_.pipeline);
    GstElement *convert = make("videoconvert", c_.pipeline);
    GstElement *fmtcaps = make("capsfilter", c_.pipeline);
    c_.sink = make("appsink", c_.pipeline);
    if (!src || !dec || !c_.crop || !scale || !sizecaps || !convert || !fmtcaps || !c_.sink)
      return fail(DecodeStatus::Failed,
                  "missing GStreamer elements (need filesrc, decodebin, videocrop, videoscale, videoconvert, "
                  "appsink: install gstreamer1.0-plugins-base and -good)");
    g_object_set(src, "location", req_.path.c_str(), nullptr);
    // Scale in the decoder's format first (cheaper), then convert the small frame to RGB
    // (YuvToRgb). videoconvert only repacks what YuvToRgb does not read (NV12 to I420, P010
    // to I420_10LE, BGRx to RGB): no matrix, no dithering.
    g_object_set(scale, "add-borders", req_.resize == ResizeMode::Pad, nullptr);
    GstCaps *size = gst_caps_new_simple("video/x-raw", "width", G_TYPE_INT, req_.width, "height", G_TYPE_INT,
                                        req_.height, "pixel-aspect-ratio", GST_TYPE_FRACTION, 1, 1, nullptr);
    g_object_set(sizecaps, "caps", size, nullptr);
    gst_caps_unref(size);
    gst_util_set_object_arg(G_OBJECT(convert), "matrix-mode", "none");
    gst_util_set_object_arg(G_OBJECT(convert), "dither", "none");
    GstCaps *formats = yuv_to_rgb_input_caps();
    g_object_set(fmtcaps, "caps", formats, nullptr);
    gst_caps_unref(formats);
    // Bounded: the decoder stops when we stop pulling.
    g_object_set(c_.sink, "sync", FALSE, "max-buffers", 2, "drop", FALSE, "enable-last-sample", FALSE, nullptr);
    if (!gst_element_link(src, dec) ||
        !gst_element_link_many(c_.crop, scale, sizecaps, convert, fmtcaps, c_.sink, nullptr))
      return fail(DecodeStatus::Failed, "could not link the decoding chain");
    g_signal_connect(dec, "pad-added", G_CALLBACK(on_pad_added), &c_);
    g_signal_connect(dec, "no-more-pads", G_CALLBACK(on_no_more_pads), &c_);
    g_signal_connect(c_.pipeline, "deep-element-added", G_CALLBACK(on_element_added), &c_);

    // decodebin drops errors of a demuxer it is still trying out (a truncated MP4 can fail
    // that early): a file that nobody reads any more before a stream is found has failed.
    GstPad *srcpad = gst_element_get_static_pad(src, "src");
    gst_pad_add_probe(srcpad, GstPadProbeType(GST_PAD_PROBE_TYPE_BUFFER | GST_PAD_PROBE_TYPE_PULL), note_read, &c_,
                      nullptr);
    gst_object_unref(srcpad);
    c_.last_read = g_get_monotonic_time();
    return DecodeStatus::Ok;
  }

  // All streams are exposed and none is ours: said first, as decodebin then fails with a
  // "not linked" flow error of its own.
  std::string stream_missing() {
    std::lock_guard<std::mutex> g(c_.lock);
    if (!c_.no_more_pads || c_.linked) return "";
    return c_.video_pads == 0 ? std::string("no video stream")
                              : "video-stream=" + std::to_string(req_.video_stream) + " but the file has " +
                                    std::to_string(c_.video_pads) + " video stream(s)";
  }

  // To PAUSED: the stream is found and linked, its frame rate and duration known.
  DecodeStatus preroll() {
    gst_element_set_state(c_.pipeline, GST_STATE_PAUSED);
    for (;;) {
      std::string err = bus_error(c_.pipeline);
      if (!err.empty()) {
        std::string missing = stream_missing();
        return fail(DecodeStatus::Failed, missing.empty() ? "cannot decode: " + err : missing);
      }
      GstState state;
      GstStateChangeReturn r = gst_element_get_state(c_.pipeline, &state, nullptr, kSlice);
      if (r == GST_STATE_CHANGE_SUCCESS && state == GST_STATE_PAUSED) return DecodeStatus::Ok;
      if (r == GST_STATE_CHANGE_FAILURE) {
        err = bus_error(c_.pipeline, GST_SECOND);
        std::string missing = stream_missing();
        return fail(DecodeStatus::Failed, !missing.empty() ? missing
                                          : "cannot decode: " + (err.empty() ? std::string("state change failed") : err));
      }
      std::string missing = stream_missing();
      if (!missing.empty()) return fail(DecodeStatus::Failed, missing);
      {
        std::lock_guard<std::mutex> g(c_.lock);
        if (!c_.linked && g_get_monotonic_time() - c_.last_read > kStallUs && !read_may_block(c_))
          return fail(DecodeStatus::Failed,
                      "cannot decode: no playable stream found and the file is no longer read (truncated or corrupt)");
      }
      if (cancelled()) return DecodeStatus::Cancelled;
      if (timed_out()) {
        std::lock_guard<std::mutex> g(c_.lock);
        return fail(DecodeStatus::Timeout, "decode timeout: no frame within " + std::to_string(req_.timeout_s) + " s" +
                                               (c_.linked        ? ""
                                                : c_.no_more_pads ? " (no video stream)"
                                                                  : " (no stream found yet)"));
      }
    }
  }

  // Which stream was taken, for the clip's log and its error messages.
  std::string stream_text() {
    std::lock_guard<std::mutex> g(c_.lock);
    return "video stream " + std::to_string(req_.video_stream) +
           (c_.no_more_pads ? " of " + std::to_string(c_.video_pads) : std::string()) + ", " +
           std::to_string(c_.width) + "x" + std::to_string(c_.height) + ", " + colour_.describe();
  }

  void read_stream_facts() {
    {
      std::lock_guard<std::mutex> g(c_.lock);
      fps_n_ = c_.fps_n;
      fps_d_ = c_.fps_d;
      colour_ = c_.colour;
    }
    if (fps_n_ <= 0 && req_.source_fps > 0) gst_util_double_to_fraction(req_.source_fps, &fps_n_, &fps_d_);
    fps_known_ = fps_n_ > 0;
    if (!fps_known_) fps_n_ = 25, fps_d_ = 1;  // variable rate: frame numbers are only indicative
    if (!gst_element_query_duration(c_.pipeline, GST_FORMAT_TIME, &duration_)) duration_ = -1;
    if (duration_ > 0 && fps_known_)
      out_->total_frames = gst_util_uint64_scale_round(duration_, fps_n_, GST_SECOND * (guint64)fps_d_);
    // An earlier decode found the stream shorter than the container says.
    if (req_.known_frames >= 0 && (out_->total_frames < 0 || req_.known_frames < out_->total_frames))
      learned_end(req_.known_frames);
    // The container lasts longer than the manifest's count of the video stream (an audio or subtitle
    // track outlasts it): place within the count, not past the stream's end. A manifest that says more
    // than the container is found out as before (the stream ends early).
    else if (req_.manifest_frames > 0 && fps_known_ && out_->total_frames > req_.manifest_frames + 2)
      learned_end(req_.manifest_frames);
  }

  // The stream holds `frames` frames (fewer than the estimate): what placing goes by from now on.
  void learned_end(int64_t frames) {
    out_->total_frames = frames;
    if (fps_known_) duration_ = gint64(gst_util_uint64_scale(frames, GST_SECOND * (guint64)fps_d_, fps_n_));
  }

  // The stream ended before the clip was whole: how many frames it really has, from the last
  // frame seen, else (a clip placed past the end sees none) the container's own count. False
  // when that is within the two frames a duration's rounding may miss (placing earlier by what
  // is missing does) or no fewer than what the clip was placed by.
  bool find_real_end() {
    int64_t frames = last_src_ >= 0 && fps_known_ ? last_src_ + 1 : -1;
    if (frames < 0) {
      // Not a pipe: it was read once already, and a count would read it again (or block).
      if (!g_file_test(req_.path.c_str(), G_FILE_TEST_IS_REGULAR)) return false;
      StreamFrames sf;
      std::string why;
      if (!count_video_frames(req_.path, req_.video_stream, &sf, &why, std::max(1.0, req_.timeout_s / 2))) {
        GST_INFO("%s: cannot count the frames: %s", req_.path.c_str(), why.c_str());
        return false;
      }
      frames = sf.frames;
    }
    const int64_t before = out_->total_frames;
    if (before >= 0 && frames + 2 >= before) return false;
    GST_INFO("%s: the stream has %" G_GINT64_FORMAT " frames, not the %" G_GINT64_FORMAT " its duration says",
             req_.path.c_str(), frames, before);
    out_->real_frames = frames;
    learned_end(frames);
    return true;
  }

  // fps > 0: sample k is the frame shown at t_start + k / fps, timestamps rounded to the
  // nearest 1 / fps (as ffmpeg's fps filter does): the last frame whose time is before
  // t_start + (k + 1/2) / fps.
  GstClockTime tick(GstClockTime t0, double k) const {
    return t0 + GstClockTime(std::llround(k * double(GST_SECOND) / req_.fps));
  }
  uint64_t frame_number(GstClockTime pts) const {
    return gst_util_uint64_scale_round(pts, fps_n_, GST_SECOND * (guint64)fps_d_);
  }

  // Where the clip starts (clip-start), or Short when the video cannot hold it.
  DecodeStatus place_clip() {
    if (by_time_) {
      const GstClockTime span_t = tick(0, req_.num_frames - 1);
      if (duration_ <= 0) return DecodeStatus::Ok;
      if (GstClockTime(duration_) <= span_t && !req_.pad_short)
        return fail(DecodeStatus::Short, "too short: video lasts " + std::to_string(duration_ / 1e9) +
                                             " s, clip needs " + std::to_string(span_t / 1e9) +
                                             " s (num-frames at fps=" + std::to_string(req_.fps) + "; " +
                                             stream_text() + ")");
      GstClockTime room = GstClockTime(duration_) > span_t ? GstClockTime(duration_) - span_t - 1 : 0;
      if (req_.start == ClipStart::Center) t_start_ = room / 2;
      if (req_.start == ClipStart::Random) t_start_ = (req_.random_key % (room / GST_USECOND + 1)) * GST_USECOND;
      t_start_known_ = req_.start != ClipStart::Start;
    } else if (out_->total_frames >= 0) {
      const int64_t span = int64_t(req_.num_frames - 1) * req_.stride + 1;
      if (out_->total_frames + 2 < span && !req_.pad_short)
        return fail(DecodeStatus::Short, "too few frames: video has " + std::to_string(out_->total_frames) +
                                             ", clip needs " + std::to_string(span) +
                                             " (num-frames x frame-stride; " + stream_text() + ")");
      int64_t room = std::max<int64_t>(0, out_->total_frames - span);
      if (req_.start == ClipStart::Center) start_ = room / 2;
      if (req_.start == ClipStart::Random) start_ = int64_t(req_.random_key % uint64_t(room + 1));
    }
    return DecodeStatus::Ok;
  }

  void drop_prev() {
    if (prev_) gst_buffer_unref(prev_);
    if (prev_rgb_) gst_buffer_unref(prev_rgb_);
    prev_ = prev_rgb_ = nullptr;
  }
  GstBuffer *to_rgb(GstBuffer *b) {
    GstBuffer *rgb = conv_.convert(b);
    if (!rgb) convert_error_ = "cannot map a decoded frame for the RGB conversion";
    return rgb;
  }
  bool emit_prev() {
    if (!prev_rgb_) prev_rgb_ = to_rgb(prev_);
    if (!prev_rgb_) return false;
    out_->frames.push_back(gst_buffer_ref(prev_rgb_));
    out_->source_frames.push_back(frame_number(prev_pts_));
    return true;
  }

  // Frame counts from the duration can be off by a frame or two, and by far more where another
  // track outlasts the video or the rate varies: when a clip meets the end of the stream, it is
  // placed within the frames that exist (or earlier by what it missed) and decoded again.
  DecodeStatus pull_frames() {
    for (int attempt = 0; attempt < 3; attempt++) {
      DecodeStatus s = seek_to_clip(attempt);
      if (s != DecodeStatus::Ok || (s = pull_attempt()) != DecodeStatus::Ok) return s;
      // The last frame is shown until its end.
      while (by_time_ && eos_ && prev_ && (int)out_->frames.size() < req_.num_frames && tick(t_start_, k_) < prev_end_) {
        if (!emit_prev()) break;
        k_++;
      }
      if (!convert_error_.empty()) return fail(DecodeStatus::Failed, convert_error_);
      const int64_t missing = req_.num_frames - (int64_t)out_->frames.size();
      if (missing > 0 && eos_ && attempt < 2) {
        const bool none_seen = last_src_ < 0;
        // Placed past the real end: placed anew within the frames that exist.
        if (find_real_end() && none_seen) {
          const DecodeStatus p = place_clip();
          if (p != DecodeStatus::Ok) return p;
          continue;
        }
      }
      if (by_time_) {
        if (missing == 0 || !eos_ || t_start_ == 0) break;
        GstClockTime back = tick(0, double(missing));
        t_start_ = t_start_ > back ? t_start_ - back : 0;
        t_start_known_ = true;
      } else {
        if (missing == 0 || !eos_ || start_ == 0) break;
        start_ = std::max<int64_t>(0, start_ - missing * req_.stride);
      }
    }
    out_->frames_decoded = c_.decoded.load();
    if (by_time_) out_->start_time = t_start_;
    out_->stream = stream_text();  // all streams are known by now
    out_->source_width = c_.width;
    out_->source_height = c_.height;
    return DecodeStatus::Ok;
  }

  DecodeStatus seek_to_clip(int attempt) {
    GstClockTime seek_to = GST_CLOCK_TIME_NONE;
    if (!by_time_ && (start_ > 0 || attempt > 0))
      seek_to = gst_util_uint64_scale(start_, GST_SECOND * (guint64)fps_d_, fps_n_);
    // A second early: the frame shown at t_start may begin well before it (variable rate).
    if (by_time_ && t_start_known_ && (t_start_ > 0 || attempt > 0))
      seek_to = t_start_ > GST_SECOND ? t_start_ - GST_SECOND : 0;
    if (seek_to != GST_CLOCK_TIME_NONE &&
        !gst_element_seek(c_.pipeline, 1.0, GST_FORMAT_TIME, GstSeekFlags(GST_SEEK_FLAG_FLUSH | GST_SEEK_FLAG_ACCURATE),
                          GST_SEEK_TYPE_SET, seek_to, GST_SEEK_TYPE_NONE, -1))
      return fail(DecodeStatus::Failed, by_time_ ? "seek to " + std::to_string(seek_to / 1e9) + " s failed"
                                                 : "seek to frame " + std::to_string(start_) + " failed");
    gst_element_set_state(c_.pipeline, GST_STATE_PLAYING);
    return DecodeStatus::Ok;
  }

  // Pulls decoded frames until the clip is whole, the stream ends or a conversion fails.
  DecodeStatus pull_attempt() {
    out_->clear();
    drop_prev();
    eos_ = false;
    seen_ = 0;
    last_src_ = -1;
    k_ = 0;
    last_pts_ = GST_CLOCK_TIME_NONE;
    while ((int)out_->frames.size() < req_.num_frames) {
      if (cancelled()) return DecodeStatus::Cancelled;
      std::string err = bus_error(c_.pipeline);
      if (!err.empty())
        return fail(DecodeStatus::Failed, "decoding error after " + std::to_string(out_->frames.size()) +
                                              " frames of " + stream_text() + ": " + err);
      if (timed_out())
        return fail(DecodeStatus::Timeout, "decode timeout: " + std::to_string(out_->frames.size()) + " of " +
                                               std::to_string(req_.num_frames) + " frames after " +
                                               std::to_string(req_.timeout_s) + " s");
      GstSample *sample = gst_app_sink_try_pull_sample(GST_APP_SINK(c_.sink), kSlice);
      if (!sample) {
        if (gst_app_sink_is_eos(GST_APP_SINK(c_.sink))) {
          eos_ = true;
          break;
        }
        continue;
      }
      const DecodeStatus s = take_sample(sample);
      gst_sample_unref(sample);
      if (s != DecodeStatus::Ok) return s;
      if (!convert_error_.empty()) break;
    }
    return DecodeStatus::Ok;
  }

  // One decoded frame: kept (frame-stride), or held as the candidate for the next sample (fps).
  DecodeStatus take_sample(GstSample *sample) {
    GstCaps *caps = gst_sample_get_caps(sample);
    if (caps && (!conv_caps_ || !gst_caps_is_equal(caps, conv_caps_))) {
      if (prev_ && !prev_rgb_) prev_rgb_ = to_rgb(prev_);  // made in the format it came in
      GstVideoInfo vi;
      std::string why;
      if (!gst_video_info_from_caps(&vi, caps) || !conv_.configure(vi, colour_, &why))
        return fail(DecodeStatus::Failed, why.empty() ? "unreadable caps from the decoder" : why);
      gst_caps_replace(&conv_caps_, caps);
    }
    GstBuffer *buf = gst_sample_get_buffer(sample);
    // The time in the stream (what seeks and the clip refer to): an MP4's edit list can
    // shift timestamps by the decoder's delay.
    GstClockTime stream_pts = GST_CLOCK_TIME_NONE;
    if (GST_BUFFER_PTS_IS_VALID(buf)) {
      const GstSegment *seg = gst_sample_get_segment(sample);
      stream_pts = seg && seg->format == GST_FORMAT_TIME
                       ? gst_segment_to_stream_time(seg, GST_FORMAT_TIME, GST_BUFFER_PTS(buf))
                       : GST_BUFFER_PTS(buf);
    }
    if (by_time_) {
      // Without a timestamp, a frame follows the last one by the stream's frame duration.
      GstClockTime pts = stream_pts != GST_CLOCK_TIME_NONE ? stream_pts
                         : last_pts_ == GST_CLOCK_TIME_NONE
                             ? 0
                             : last_pts_ + gst_util_uint64_scale(GST_SECOND, fps_d_, fps_n_);
      last_pts_ = pts;
      last_src_ = std::max<int64_t>(last_src_, int64_t(frame_number(pts)));
      if (!t_start_known_) t_start_ = pts, t_start_known_ = true;
      while (prev_ && (int)out_->frames.size() < req_.num_frames && pts >= tick(t_start_, k_ + 0.5)) {
        if (!emit_prev()) break;
        k_++;
      }
      drop_prev();
      prev_ = gst_buffer_ref(buf);
      prev_pts_ = pts;
      prev_end_ = pts + (GST_BUFFER_DURATION_IS_VALID(buf) ? GST_BUFFER_DURATION(buf)
                                                           : gst_util_uint64_scale(GST_SECOND, fps_d_, fps_n_));
      return DecodeStatus::Ok;
    }
    uint64_t src_frame = stream_pts != GST_CLOCK_TIME_NONE ? frame_number(stream_pts) : uint64_t(start_ + seen_);
    last_src_ = std::max<int64_t>(last_src_, int64_t(src_frame));
    if ((int64_t)src_frame < start_) return DecodeStatus::Ok;  // before the clip: an inexact seek let it through
    if (seen_++ % req_.stride == 0) {
      if (GstBuffer *rgb = to_rgb(buf)) {
        out_->frames.push_back(rgb);
        out_->source_frames.push_back(src_frame);
      }
    }
    return DecodeStatus::Ok;
  }

  // A clip cut short by the stream's end: Short, or (short-clips=pad) its last frame repeated.
  DecodeStatus pad_short() {
    if ((int)out_->frames.size() < req_.num_frames) {
      if (!req_.pad_short || out_->frames.empty()) {
        *reason_ = "too few frames: got " + std::to_string(out_->frames.size()) + " of " +
                   std::to_string(req_.num_frames) + (eos_ ? " before the end of the stream" : "") + " (" +
                   out_->stream + ")";
        out_->clear();
        return DecodeStatus::Short;
      }
      while ((int)out_->frames.size() < req_.num_frames) {
        out_->frames.push_back(gst_buffer_ref(out_->frames.back()));
        out_->source_frames.push_back(out_->source_frames.back());
      }
    }
    GST_INFO("%s: %zu frames from %" G_GINT64_FORMAT " (decoded %" G_GUINT64_FORMAT ", total %" G_GINT64_FORMAT
             "; %s)",
             req_.path.c_str(), out_->frames.size(), start_, out_->frames_decoded, out_->total_frames,
             out_->stream.c_str());
    return DecodeStatus::Ok;
  }

  Chain &c_;
  const ClipRequest &req_;
  const std::atomic<bool> *cancel_;
  DecodedClip *out_;
  std::string *reason_;
  const Clock::time_point deadline_;
  const bool by_time_;  // fps > 0: samples chosen by timestamp; else every stride-th frame
  // The stream.
  int fps_n_ = 0, fps_d_ = 1;
  bool fps_known_ = false;
  Colour colour_;
  gint64 duration_ = -1;
  // Where the clip starts.
  int64_t start_ = 0;          // frame-stride: the clip's first frame
  GstClockTime t_start_ = 0;   // fps: the time of the first sample
  bool t_start_known_ = false;  // clip-start=start: the first frame's time
  // Pulling.
  YuvToRgb conv_;
  GstCaps *conv_caps_ = nullptr;
  GstBuffer *prev_ = nullptr, *prev_rgb_ = nullptr;  // fps: the last frame seen and its RGB, made once
  GstClockTime prev_pts_ = 0, prev_end_ = 0, last_pts_ = GST_CLOCK_TIME_NONE;
  int64_t seen_ = 0, k_ = 0;
  int64_t last_src_ = -1;  // the highest source frame number seen in this attempt
  bool eos_ = false;
  std::string convert_error_;
};

DecodeStatus decode_in(Chain &c, const std::atomic<bool> *cancel, DecodedClip *out, std::string *reason) {
  return ClipDecode(c, cancel, out, reason).run();
}

// One decode on a thread of its own, which the caller can leave behind: a read() on a stalled
// mount or pipe blocks the chain, its state changes and its teardown for as long as it likes.
// The thread holds the job (the request the chain's callbacks read, the result), so nothing
// it touches goes away before it returns; it never touches the caller's memory.
struct Job {
  ClipRequest req;
  std::atomic<bool> stop{false};  // the caller cancelled or left
  std::mutex m;
  std::condition_variable cv;
  bool answered = false, finished = false, abandoned = false;
  DecodeStatus status = DecodeStatus::Failed;
  DecodedClip clip;
  std::string reason;
};

void run_job(const std::shared_ptr<Job> &job) {
  DecodeStatus status;
  std::string reason;
  {
    Chain c;
    c.req = &job->req;
    DecodedClip clip;
    status = decode_in(c, &job->stop, &clip, &reason);
    {
      std::lock_guard<std::mutex> g(job->m);
      job->status = status;
      job->reason = reason;
      if (!job->abandoned) job->clip = std::move(clip);  // else dropped here
      job->answered = true;
    }
    job->cv.notify_all();
  }  // ~Chain: to NULL, which waits for the streaming threads (and a read that blocks)
  std::lock_guard<std::mutex> g(job->m);
  job->finished = true;
  job->cv.notify_all();
  if (job->abandoned) {
    abandoned_running--;
    GST_WARNING("abandoned decoding chain of %s has stopped (%s)", job->req.path.c_str(), decode_status_name(status));
  }
}

// job->m held.
void abandon(Job &job, const char *why) {
  job.abandoned = true;
  job.stop = true;
  job.clip.clear();
  abandoned_total++;
  abandoned_running++;
  GST_WARNING("abandoning the decoding chain of %s: %s; it is not waited for", job.req.path.c_str(), why);
}

}  // namespace

DecodeStatus decode_clip(const ClipRequest &req, const std::atomic<bool> *cancel, DecodedClip *out,
                         std::string *reason) {
  init_debug();
  out->clear();
  auto job = std::make_shared<Job>();
  job->req = req;
  try {
    std::thread(run_job, job).detach();
  } catch (const std::system_error &e) {
    *reason = std::string("cannot start a decoding thread: ") + e.what();
    return DecodeStatus::Failed;
  }
  using Clock = std::chrono::steady_clock;
  auto cancelled = [&] { return cancel && cancel->load(); };
  const auto give_up = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(req.timeout_s)) + kAnswerSlack;
  std::unique_lock<std::mutex> lk(job->m);
  // The chain checks its own deadline; this one only catches a chain stuck in a call.
  while (!job->answered && Clock::now() < give_up) {
    if (cancelled()) job->stop = true;  // answers Cancelled within a slice unless stuck
    job->cv.wait_for(lk, std::chrono::nanoseconds(kSlice));
    if (job->stop && !job->answered) {
      if (job->cv.wait_for(lk, kStopGrace, [&] { return job->answered; })) break;
      abandon(*job, "cancelled while it was stuck (a read or open that blocks)");
      return DecodeStatus::Cancelled;
    }
  }
  if (!job->answered) {
    abandon(*job, "no answer after decode-timeout (a read or open that blocks)");
    *reason = "decode timeout: nothing within " + std::to_string(req.timeout_s) +
              " s (the file does not open or a read blocks); its decoding chain was abandoned";
    return DecodeStatus::Timeout;
  }
  DecodeStatus status = job->status;
  *reason = job->reason;
  *out = std::move(job->clip);
  if (!job->cv.wait_for(lk, kStopGrace, [&] { return job->finished; })) {
    abandon(*job, "it did not stop (a read that blocks)");
    if (status != DecodeStatus::Ok) *reason += "; its decoding chain did not stop and was abandoned";
  }
  return status;
}

}  // namespace videotrain
