/* Readable lines for bus messages: see bus_text.h. */
#include "bus_text.h"

#include <cstdio>

#include "utf8_cut.h"

namespace videotrain {

namespace {

std::string str(const GstStructure *s, const char *f) {
  const char *v = gst_structure_get_string(s, f);
  return v ? v : "";
}

double num(const GstStructure *s, const char *f) {
  double d = 0;
  return gst_structure_get_double(s, f, &d) ? d : 0;
}

guint64 u64(const GstStructure *s, const char *f) {
  guint64 v = 0;
  if (gst_structure_get_uint64(s, f, &v)) return v;
  guint u = 0;
  return gst_structure_get_uint(s, f, &u) ? u : 0;
}

template <typename... A>
std::string fmt(const char *f, A... a) {
  char buf[1024];
  std::snprintf(buf, sizeof buf, f, a...);
  return buf;
}

// Any structure: "name: field value, ...".
std::string generic(const GstStructure *s) {
  std::string out = gst_structure_get_name(s);
  const int n = gst_structure_n_fields(s);
  for (int i = 0; i < n; i++) {
    const char *f = gst_structure_nth_field_name(s, i);
    const GValue *v = gst_structure_get_value(s, f);
    std::string value;
    if (G_VALUE_HOLDS_STRING(v)) {
      value = g_value_get_string(v) ? g_value_get_string(v) : "";
    } else {
      gchar *t = gst_value_serialize(v);
      value = t ? t : "?";
      g_free(t);
    }
    out += (i ? ", " : ": ") + std::string(f) + " " + value;
  }
  return out;
}

}  // namespace

std::string bus_text(const GstStructure *s) {
  const std::string name = gst_structure_get_name(s);
  if (name == "ddptrainsink-step") {
    gboolean skipped = FALSE;
    gst_structure_get_boolean(s, "skipped", &skipped);
    guint epoch = 0;
    gst_structure_get_uint(s, "epoch", &epoch);
    // The same line videotrain-launch makes of gst-launch-1.0 -m's structures; the run's progress last.
    std::string progress;
    if (num(s, "steps-per-second") > 0) progress += fmt(" | %.2f steps/s", num(s, "steps-per-second"));
    if (const guint64 max_steps = u64(s, "max-steps"))
      progress += fmt(" | %" G_GUINT64_FORMAT "/%" G_GUINT64_FORMAT, u64(s, "step"), max_steps);
    double eta = 0;
    if (gst_structure_get_double(s, "eta-seconds", &eta)) {
      const long long e = static_cast<long long>(eta + 0.5);
      progress += e >= 3600 ? fmt(", ETA %lld:%02lld:%02lld", e / 3600, e / 60 % 60, e % 60)
                            : fmt(", ETA %lld:%02lld", e / 60, e % 60);
    }
    return fmt("step %" G_GUINT64_FORMAT " | epoch %u | loss %.4f | lr %.2e | samples/s %.1f | data wait %.0f%%%s%s",
               u64(s, "step"), epoch, num(s, "loss"), num(s, "lr"), num(s, "samples-per-second"),
               100 * num(s, "data-wait"), skipped ? " | skipped (non-finite)" : "", progress.c_str());
  }
  if (name == "ddptrainsink-checkpoint") {
    gboolean rescue = FALSE;
    gst_structure_get_boolean(s, "rescue", &rescue);
    return fmt("%s of step %" G_GUINT64_FORMAT " written: %s", rescue ? "rescue checkpoint" : "checkpoint",
               u64(s, "step"), str(s, "path").c_str());
  }
  if (name == "ddpvalsink-result")
    return fmt("validation of step %" G_GUINT64_FORMAT ": loss %.4f over %" G_GUINT64_FORMAT " samples in %.1f s",
               u64(s, "step"), num(s, "loss"), u64(s, "samples"), num(s, "seconds"));
  if (name == "ddpvalsink-skipped") return "validation skipped: " + str(s, "text");
  if (name == "csvvideosrc-epoch")
    return fmt("csvvideosrc%s%s: epoch %" G_GUINT64_FORMAT " done: %" G_GUINT64_FORMAT " clips (%" G_GUINT64_FORMAT
               " decoded, %" G_GUINT64_FORMAT " from the latent cache, %" G_GUINT64_FORMAT " replaced)",
               str(s, "manifest").empty() ? "" : " ", str(s, "manifest").c_str(), u64(s, "epoch"), u64(s, "clips"),
               u64(s, "decoded"), u64(s, "cached"), u64(s, "replaced"));
  if (name == "ddpsampler-sample") {
    gint64 seed = 0;
    gst_structure_get_int64(s, "seed", &seed);
    gint frames = 0, width = 0, height = 0;
    gst_structure_get_int(s, "num-frames", &frames);
    gst_structure_get_int(s, "width", &width);
    gst_structure_get_int(s, "height", &height);
    std::string text = str(s, "prompt-text");
    if (text.size() > 60) text = text.substr(0, utf8_cut(text, 57)) + "...";
    return fmt("sample of step %" G_GUINT64_FORMAT ", prompt %u (\"%s\"): %dx%dx%d, seed %" G_GINT64_FORMAT
               ", %s, %.1f s",
               u64(s, "step"), guint(u64(s, "prompt")), text.c_str(), frames, width, height, seed,
               str(s, "sampler").c_str(), num(s, "seconds"));
  }
  if (name == "samplesink-file")
    return fmt("sample written: %s (step %" G_GUINT64_FORMAT ", prompt %u, %" G_GUINT64_FORMAT " frames)",
               str(s, "path").c_str(), u64(s, "step"), guint(u64(s, "prompt")), u64(s, "frames"));
  if (name == "ddptrainsink-export") {
    gboolean ema = FALSE;
    gst_structure_get_boolean(s, "ema", &ema);
    return fmt("exported %sstep %" G_GUINT64_FORMAT " (%s): %s", ema ? "the EMA of " : "", u64(s, "step"),
               str(s, "dtype").c_str(), str(s, "path").c_str());
  }
  if (name == "vaeencoder-dropped")
    return fmt("vaeencoder dropped sample %" G_GUINT64_FORMAT " (epoch %" G_GUINT64_FORMAT ", clip %" G_GUINT64_FORMAT
               "): %s",
               u64(s, "sample-id"), u64(s, "epoch"), u64(s, "clip-index"), str(s, "reason").c_str());
  if (name == "textencoder-summary") {
    gboolean loaded = TRUE;
    gst_structure_get_boolean(s, "encoder-loaded", &loaded);
    const guint64 dropped = u64(s, "dropped");
    return fmt("textencoder: %" G_GUINT64_FORMAT " captions (%" G_GUINT64_FORMAT " encoded, %" G_GUINT64_FORMAT
               " from the cache)%s%s",
               u64(s, "captions"), u64(s, "encoded"), u64(s, "cache-reads"),
               dropped ? (", " + std::to_string(dropped) + " dropped to the empty caption").c_str() : "",
               loaded ? "" : "; the text encoder was never loaded");
  }
  return generic(s);
}

}  // namespace videotrain
