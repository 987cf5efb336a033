/* The latent cache's handshake: see cache_protocol.h. */
#include "cache_protocol.h"

#include <cstring>
#include <set>

namespace videotrain {

namespace {

GstStructure *clip_structure(const char *name, const ClipIdentity &c) {
  return gst_structure_new(name, "sample-id", G_TYPE_UINT64, c.sample_id, "epoch", G_TYPE_UINT, c.epoch,
                           "clip-index", G_TYPE_UINT64, c.clip_index, "num-frames", G_TYPE_UINT, c.num_frames,
                           "source-frame", G_TYPE_UINT64, c.source_frame, "padding", G_TYPE_BOOLEAN,
                           c.padding ? TRUE : FALSE, "caption", G_TYPE_STRING, c.caption.c_str(), "path",
                           G_TYPE_STRING, c.path.c_str(), "split", G_TYPE_STRING, c.split.c_str(), "source-key",
                           G_TYPE_STRING, c.source_key.c_str(), "pts", G_TYPE_UINT64, c.pts, "duration",
                           G_TYPE_UINT64, c.duration, "group", G_TYPE_UINT64, c.group, "group-size", G_TYPE_UINT,
                           c.group_size, "width", G_TYPE_INT, c.width, "height", G_TYPE_INT, c.height, nullptr);
}

bool read_clip(const GstStructure *s, ClipIdentity *c) {
  gboolean padding = FALSE;
  guint64 pts = GST_CLOCK_TIME_NONE, dur = GST_CLOCK_TIME_NONE;
  if (!gst_structure_get_uint64(s, "sample-id", &c->sample_id) || !gst_structure_get_uint(s, "epoch", &c->epoch) ||
      !gst_structure_get_uint64(s, "clip-index", &c->clip_index) ||
      !gst_structure_get_uint(s, "num-frames", &c->num_frames))
    return false;
  gst_structure_get_uint64(s, "source-frame", &c->source_frame);
  gst_structure_get_uint64(s, "group", &c->group);
  gst_structure_get_uint(s, "group-size", &c->group_size);
  gst_structure_get_int(s, "width", &c->width);
  gst_structure_get_int(s, "height", &c->height);
  gst_structure_get_boolean(s, "padding", &padding);
  c->padding = padding;
  auto str = [s](const char *f) {
    const char *v = gst_structure_get_string(s, f);
    return std::string(v ? v : "");
  };
  c->caption = str("caption");
  c->path = str("path");
  c->split = str("split");
  c->source_key = str("source-key");
  gst_structure_get_uint64(s, "pts", &pts);
  gst_structure_get_uint64(s, "duration", &dur);
  c->pts = pts;
  c->duration = dur;
  return !c->source_key.empty();
}

// Pads pass through ghost pads and proxies to the element that does the work.
GstElement *upstream_element(GstPad *sinkpad) {
  GstPad *peer = gst_pad_get_peer(sinkpad);
  while (peer && GST_IS_GHOST_PAD(peer)) {
    GstPad *target = gst_ghost_pad_get_target(GST_GHOST_PAD(peer));
    gst_object_unref(peer);
    peer = target;
  }
  if (!peer) return nullptr;
  GstElement *e = gst_pad_get_parent_element(peer);
  gst_object_unref(peer);
  return e;
}

bool pixel_neutral_property(const char *name) {
  static const std::set<std::string> skip{"name", "parent", "n-threads", "qos", "silent", "async", "sync",
                                          "last-sample", "signal-handoffs", "dump", "stats"};
  return skip.count(name) > 0;
}

bool is_queue(const std::string &factory) {
  return factory == "queue" || factory == "queue2" || factory == "multiqueue";
}

}  // namespace

GstQuery *cache_query_new(const ClipIdentity &clip) {
  return gst_query_new_custom(GST_QUERY_CUSTOM, clip_structure(VIDEOTRAIN_CACHE_QUERY_NAME, clip));
}

GstQuery *cache_probe_query_new() {
  return gst_query_new_custom(GST_QUERY_CUSTOM,
                              gst_structure_new(VIDEOTRAIN_CACHE_QUERY_NAME, "probe", G_TYPE_BOOLEAN, TRUE, nullptr));
}

bool is_cache_probe_query(GstQuery *query) {
  if (GST_QUERY_TYPE(query) != GST_QUERY_CUSTOM) return false;
  const GstStructure *s = gst_query_get_structure(query);
  gboolean probe = FALSE;
  return s && gst_structure_has_name(s, VIDEOTRAIN_CACHE_QUERY_NAME) && gst_structure_get_boolean(s, "probe", &probe) &&
         probe;
}

bool parse_cache_query(GstQuery *query, ClipIdentity *clip) {
  if (GST_QUERY_TYPE(query) != GST_QUERY_CUSTOM) return false;
  const GstStructure *s = gst_query_get_structure(query);
  return s && gst_structure_has_name(s, VIDEOTRAIN_CACHE_QUERY_NAME) && read_clip(s, clip);
}

void answer_cache_query(GstQuery *query, bool cached) {
  gst_structure_set(gst_query_writable_structure(query), "cached", G_TYPE_BOOLEAN, cached ? TRUE : FALSE, nullptr);
}

bool cache_query_cached(GstQuery *query) {
  gboolean cached = FALSE;
  const GstStructure *s = gst_query_get_structure(query);
  return s && gst_structure_get_boolean(s, "cached", &cached) && cached;
}

GstEvent *cached_clip_event_new(const ClipIdentity &clip) {
  return gst_event_new_custom(GST_EVENT_CUSTOM_DOWNSTREAM, clip_structure(VIDEOTRAIN_CACHED_CLIP_EVENT_NAME, clip));
}

bool parse_cached_clip_event(GstEvent *event, ClipIdentity *clip) {
  if (GST_EVENT_TYPE(event) != GST_EVENT_CUSTOM_DOWNSTREAM) return false;
  const GstStructure *s = gst_event_get_structure(event);
  return s && gst_structure_has_name(s, VIDEOTRAIN_CACHED_CLIP_EVENT_NAME) && read_clip(s, clip);
}

std::string upstream_chain_fingerprint(GstPad *sinkpad, const char *stop_factory) {
  std::string out;
  GstElement *e = upstream_element(sinkpad);
  for (int depth = 0; e && depth < 64; depth++) {
    GstElementFactory *f = gst_element_get_factory(e);
    const std::string factory = f ? GST_OBJECT_NAME(f) : G_OBJECT_TYPE_NAME(e);
    if (factory == stop_factory) {
      gst_object_unref(e);
      break;
    }
    if (!is_queue(factory)) {
      out += factory + "(";
      guint n = 0;
      GParamSpec **specs = g_object_class_list_properties(G_OBJECT_GET_CLASS(e), &n);
      for (guint i = 0; i < n; i++) {
        GParamSpec *p = specs[i];
        if ((p->flags & G_PARAM_READWRITE) != G_PARAM_READWRITE || (p->flags & G_PARAM_DEPRECATED) ||
            pixel_neutral_property(p->name))
          continue;
        GValue v = G_VALUE_INIT;
        g_value_init(&v, p->value_type);
        g_object_get_property(G_OBJECT(e), p->name, &v);
        gchar *text = gst_value_serialize(&v);
        out += std::string(p->name) + "=" + (text ? text : "?") + ";";
        g_free(text);
        g_value_unset(&v);
      }
      g_free(specs);
      out += ")";
    }
    // Follow the first sink pad upstream (elements with several inputs stop the walk there).
    GstPad *sink = nullptr;
    GstIterator *it = gst_element_iterate_sink_pads(e);
    GValue item = G_VALUE_INIT;
    if (gst_iterator_next(it, &item) == GST_ITERATOR_OK) sink = GST_PAD(g_value_dup_object(&item));
    g_value_unset(&item);
    gst_iterator_free(it);
    gst_object_unref(e);
    e = sink ? upstream_element(sink) : nullptr;
    if (sink) gst_object_unref(sink);
  }
  return out;
}

}  // namespace videotrain
