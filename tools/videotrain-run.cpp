/* videotrain-run: runs one gst-videotrain pipeline (one rank) and reports on it.
 *
 *   videotrain-run [options] PIPELINE-DESCRIPTION...
 *   videotrain-run [options] -f pipelines/demo.pipeline -D DATA=demo-data
 *   videotrain-run [options] --config run.toml [--dry-run]
 *
 * Over gst-launch-1.0 it adds: ${VAR} substitution in pipeline files (from -D and the
 * environment), a readable log of the project's bus messages, an optional line per
 * clip (--print-clips NAME), a progress line, and Ctrl-C or SIGTERM sent as EOS so
 * that sinks finish cleanly (a second signal, or no EOS within --eos-timeout, aborts).
 * A pipeline that does not parse (unknown element, property, syntax) is an error at
 * once, not a warning followed by a pipeline that never runs. --config builds the pipeline
 * from a TOML run config (run_config.h), saves it beside the checkpoints and runs it, or
 * hands it to videotrain-launch when the config asks for several ranks. */
#include <glib-unix.h>
#include <gst/gst.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <cctype>
#include <sstream>
#include <string>
#include <thread>

#include "bus_text.h"
#include "metas.h"
#include "run_config.h"

namespace {

GMainLoop *loop = nullptr;
GstElement *pipeline = nullptr;
int exit_code = 0;
int interrupts = 0;
int first_signal = 0;
// While the state change to PLAYING runs: a sink's start (ddptrainsink's rendezvous) holds the
// pipeline's state lock, so EOS cannot be sent yet.
std::atomic<bool> starting{false};
bool errored = false;
guint eos_timeout_s = 120;  // long enough for a final checkpoint
constexpr int kTeardownTimeoutS = 10;
bool quiet = false;
bool tty = false;
std::string status_line;

// ${VAR} and ${VAR:-default}, where a default may itself hold ${...} (e.g. ${VAE:-${M}/vae}, so that
// one -D M=folder names every part of a published model).
std::string expand(const std::string &text, const std::map<std::string, std::string> &defs) {
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    if (text.compare(i, 2, "${") != 0) {
      out += text[i++];
      continue;
    }
    size_t j = i + 2;
    while (j < text.size() && (std::isalnum(static_cast<unsigned char>(text[j])) || text[j] == '_')) j++;
    const std::string name = text.substr(i + 2, j - i - 2);
    const bool has_default = text.compare(j, 2, ":-") == 0;
    size_t end = j;
    if (has_default) {  // up to the matching brace
      int depth = 1;
      for (end = j + 2; end < text.size() && depth > 0; end++) {
        if (text.compare(end, 2, "${") == 0) depth++, end++;
        else if (text[end] == '}') depth--;
      }
      end--;  // at the closing brace
    }
    if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0])) || end >= text.size() || text[end] != '}') {
      out += text[i++];  // not a reference: kept as written
      continue;
    }
    auto it = defs.find(name);
    const char *env = std::getenv(name.c_str());
    if (it != defs.end()) out += it->second;
    else if (env) out += env;
    else if (has_default) out += expand(text.substr(j + 2, end - j - 2), defs);
    else {
      std::fprintf(stderr, "videotrain-run: ${%s} is not defined (use -D %s=VALUE)\n", name.c_str(), name.c_str());
      std::exit(2);
    }
    i = end + 1;
  }
  return out;
}

std::string substitute(std::string text, const std::map<std::string, std::string> &defs) {
  std::string out = expand(text, defs);
  // Comments and line breaks of pipeline files.
  std::istringstream lines(out);
  std::string line, joined;
  while (std::getline(lines, line)) {
    auto hash = line.find('#');
    if (hash != std::string::npos && (hash == 0 || line[hash - 1] == ' ' || line[hash - 1] == '\t'))
      line = line.substr(0, hash);
    if (!line.empty() && line.back() == '\\') line.pop_back();
    joined += line + " ";
  }
  return joined;
}

void print_line(const std::string &s) {
  if (tty && !status_line.empty()) std::fprintf(stderr, "\r\033[K");
  std::printf("%s\n", s.c_str());
  std::fflush(stdout);
  if (tty && !status_line.empty()) std::fprintf(stderr, "%s", status_line.c_str());
}

void set_status(const std::string &s) {
  status_line = s;
  if (tty) std::fprintf(stderr, "\r\033[K%s", s.c_str());
}

gboolean on_message(GstBus *, GstMessage *msg, gpointer) {
  switch (GST_MESSAGE_TYPE(msg)) {
    case GST_MESSAGE_ERROR: {
      GError *e = nullptr;
      gchar *dbg = nullptr;
      gst_message_parse_error(msg, &e, &dbg);
      std::fprintf(stderr, "%sERROR from %s: %s\n%s%s\n", tty ? "\n" : "", GST_OBJECT_NAME(msg->src), e->message,
                   dbg ? "  " : "", dbg ? dbg : "");
      g_error_free(e);
      g_free(dbg);
      exit_code = 1;
      errored = true;
      g_main_loop_quit(loop);
      break;
    }
    case GST_MESSAGE_WARNING: {
      GError *e = nullptr;
      gst_message_parse_warning(msg, &e, nullptr);
      print_line(std::string("WARNING ") + GST_OBJECT_NAME(msg->src) + ": " + e->message);
      g_error_free(e);
      break;
    }
    case GST_MESSAGE_ELEMENT: {
      const GstStructure *s = gst_message_get_structure(msg);
      const char *name = gst_structure_get_name(s);
      if (g_str_has_suffix(name, "-progress")) {
        set_status(videotrain::bus_text(s));
      } else if (!quiet && (g_str_has_prefix(name, "csvvideosrc") || g_str_has_prefix(name, "vaeencoder") ||
                            g_str_has_prefix(name, "microbatcher") || g_str_has_prefix(name, "ddp") ||
                            g_str_has_prefix(name, "textencoder") || g_str_has_prefix(name, "samplesink") ||
                            g_str_has_prefix(name, "promptsrc") || g_str_has_prefix(name, "vaedecoder"))) {
        print_line(videotrain::bus_text(s));
      }
      break;
    }
    case GST_MESSAGE_EOS:
      g_main_loop_quit(loop);
      break;
    default:
      break;
  }
  return TRUE;
}

// Stopping the pipeline waits for its streaming threads; one stuck in a long call (a
// collective, a blocked state change) must not keep the process alive for ever.
void arm_exit_watchdog(int code) {
  std::thread([code] {
    std::this_thread::sleep_for(std::chrono::seconds(kTeardownTimeoutS));
    std::fprintf(stderr, "videotrain-run: the pipeline did not stop within %d s; exiting\n", kTeardownTimeoutS);
    _exit(code);
  }).detach();
}

void force_quit(int code) {
  exit_code = code;
  arm_exit_watchdog(code);
  g_main_loop_quit(loop);
}

gboolean on_eos_deadline(gpointer) {
  std::fprintf(stderr, "videotrain-run: no end of stream within %u s of the interrupt; aborting\n", eos_timeout_s);
  force_quit(1);
  return G_SOURCE_REMOVE;
}

gboolean on_signal(gpointer data) {
  const int sig = GPOINTER_TO_INT(data);
  if (!first_signal) first_signal = sig;
  if (starting.load()) {
    // Nothing has been trained yet, and the start cannot be interrupted from here: leave now
    // rather than after the rendezvous' timeout.
    std::fprintf(stderr,
                 "\nvideotrain-run: %s while the pipeline is starting (e.g. ddptrainsink waiting for its peers): "
                 "nothing was trained; exiting\n",
                 sig == SIGINT ? "interrupt" : "SIGTERM");
    std::fflush(nullptr);
    _exit(128 + sig);
  }
  if (++interrupts == 1) {
    std::fprintf(stderr, "\nvideotrain-run: %s: sending EOS (again to abort)\n", sig == SIGINT ? "interrupt" : "SIGTERM");
    // Off the main loop: a source takes its streaming lock to queue EOS, and a streaming
    // thread stuck downstream would block us before the deadline is even set.
    std::thread([p = GST_ELEMENT(gst_object_ref(pipeline))] {
      gst_element_send_event(p, gst_event_new_eos());
      gst_object_unref(p);
    }).detach();
    if (eos_timeout_s > 0) g_timeout_add_seconds(eos_timeout_s, on_eos_deadline, nullptr);
  } else {
    force_quit(128 + sig);
  }
  return G_SOURCE_CONTINUE;
}

// The state change runs off the main loop (a sink's start may wait for its peers for
// minutes), so that signals are still served; its result comes back here.
gboolean on_state_change_failed(gpointer) {
  if (!errored) std::fprintf(stderr, "videotrain-run: the pipeline could not be started (state change failed)\n");
  force_quit(1);
  return G_SOURCE_REMOVE;
}

struct ClipPrinter {
  guint64 clips = 0;
  guint64 frames = 0;
  std::string caps;  // of the last clip printed: printed again when it changes (buckets)
};

GstPadProbeReturn print_clip(GstPad *pad, GstPadProbeInfo *info, gpointer data) {
  auto *p = static_cast<ClipPrinter *>(data);
  GstBuffer *b = GST_PAD_PROBE_INFO_BUFFER(info);
  p->frames++;
  if (auto *m = gst_buffer_get_videotrain_clip_meta(b); m && m->frame_index == 0) {
    p->clips++;
    GstCaps *caps = gst_pad_get_current_caps(pad);
    gchar *c = caps ? gst_caps_to_string(caps) : g_strdup("?");
    char line[1024];
    std::snprintf(line, sizeof line,
                  "clip %" G_GUINT64_FORMAT " epoch %u: row %" G_GUINT64_FORMAT ", %u frames from %" G_GUINT64_FORMAT
                  "%s, \"%s\" (%s)",
                  m->clip_index, m->epoch, m->sample_id, m->num_frames, m->source_frame,
                  m->padding ? " [padding]" : "", m->caption ? m->caption : "", m->path ? m->path : "");
    print_line(line);
    if (p->caps != c) print_line(std::string("  caps: ") + c);
    p->caps = c;
    g_free(c);
    if (caps) gst_caps_unref(caps);
  } else if (auto *s = gst_buffer_get_videotrain_sample_meta(b)) {
    p->clips++;
    char line[512];
    std::snprintf(line, sizeof line, "sample %" G_GUINT64_FORMAT " (clip %" G_GUINT64_FORMAT "): %zu bytes",
                  s->sample_id, s->clip_index, gst_buffer_get_size(b));
    print_line(line);
  }
  return GST_PAD_PROBE_OK;
}

// --config: builds and checks the pipeline, prints it, saves it (unless dry_run). Returns the exit
// status when this process is done (dry run, error, ranks run by videotrain-launch), or -1 with
// *description set when this process runs the pipeline itself.
int run_config(const std::string &config, bool dry_run, const char *argv0, std::string *description) {
  videotrain::RunPlan plan;
  std::string err;
  if (!videotrain::build_run_plan(config, &plan, &err)) {
    std::fprintf(stderr, "videotrain-run: %s\n", err.c_str());
    return 2;
  }
  for (const auto &n : plan.notes) std::printf("videotrain-run: %s\n", n.c_str());
  std::printf("%s", plan.text.c_str());
  std::fflush(stdout);
  if (dry_run) {
    // Parsed as videotrain-run would parse it, but not started.
    GError *e = nullptr;
    GstElement *p = gst_parse_launch_full(plan.pipeline.c_str(), nullptr, GST_PARSE_FLAG_FATAL_ERRORS, &e);
    bool ok = p && !e;
    if (!ok) std::fprintf(stderr, "videotrain-run: the pipeline built does not parse: %s\n", e ? e->message : "?");
    g_clear_error(&e);
    if (p) gst_object_unref(p);
    return ok ? 0 : 2;
  }
  const char *world = std::getenv("WORLD_SIZE");
  if (plan.ranks > 1 && world && std::atoi(world) > 1) {
    std::fprintf(stderr,
                 "videotrain-run: the config asks for %d ranks, but this process is already one of %s "
                 "(torchrun, srun, mpirun): give ranks = 1 (or leave it out) and let the launcher start the ranks\n",
                 plan.ranks, world);
    return 2;
  }
  if (!videotrain::write_run_files(plan, config, &err)) {
    std::fprintf(stderr, "videotrain-run: %s\n", err.c_str());
    return 1;
  }
  const std::string saved = plan.output + "/pipeline.txt";
  std::printf("videotrain-run: pipeline saved as %s\n", saved.c_str());
  if (plan.ranks == 1) {
    *description = plan.pipeline;
    return -1;
  }
  // videotrain-launch beside this program (the build tree and the install both put it there).
  gchar *self = g_file_read_link("/proc/self/exe", nullptr);
  gchar *dir = g_path_get_dirname(self ? self : argv0);
  std::string launch = std::string(dir) + "/videotrain-launch";
  g_free(self);
  g_free(dir);
  std::string n = std::to_string(plan.ranks);
  std::printf("videotrain-run: %s -n %s -f %s\n", launch.c_str(), n.c_str(), saved.c_str());
  std::fflush(stdout);
  const char *args[] = {launch.c_str(), "-n", n.c_str(), "-f", saved.c_str(), nullptr};
  execv(launch.c_str(), const_cast<char *const *>(args));
  std::fprintf(stderr, "videotrain-run: cannot start %s: %s\n", launch.c_str(), g_strerror(errno));
  return 1;
}

void usage() {
  std::fprintf(stderr,
               "usage: videotrain-run [-q] [--print-clips NAME] [-D KEY=VALUE]... (-f FILE | PIPELINE...)\n"
               "       videotrain-run [-q] [--print-clips NAME] --config RUN.toml [--dry-run]\n"
               "  -f FILE              read the pipeline description from FILE (${VAR} substituted)\n"
               "  -D KEY=VALUE         define ${KEY} for the pipeline file\n"
               "  --config FILE        build the pipeline from a run config (docs/run-config.md),\n"
               "                       save it as OUTPUT/pipeline.txt and run it\n"
               "  --dry-run            with --config: check the config, print the pipeline, run nothing\n"
               "  --print-clips NAME   print a line per clip leaving element NAME\n"
               "  --eos-timeout S      after Ctrl-C or SIGTERM, abort when no EOS came within S s\n"
               "                       (default 120; 0: wait for ever)\n"
               "  -q                   only errors, warnings and the summary\n");
}

}  // namespace

int main(int argc, char **argv) {
  gst_init(&argc, &argv);
  std::map<std::string, std::string> defs;
  std::string file, description, clip_element, config;
  bool dry_run = false;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    if (a == "-f" && i + 1 < argc) file = argv[++i];
    else if (a == "-D" && i + 1 < argc) {
      std::string kv = argv[++i];
      auto eq = kv.find('=');
      if (eq == std::string::npos) return usage(), 2;
      defs[kv.substr(0, eq)] = kv.substr(eq + 1);
    } else if (a == "--print-clips" && i + 1 < argc) clip_element = argv[++i];
    else if (a == "--config" && i + 1 < argc) config = argv[++i];
    else if (a == "--dry-run") dry_run = true;
    else if (a == "--eos-timeout" && i + 1 < argc) eos_timeout_s = static_cast<guint>(std::atoi(argv[++i]));
    else if (a == "-q") quiet = true;
    else if (a == "-h" || a == "--help") return usage(), 0;
    else description += a + " ";
  }
  if (!config.empty()) {
    if (!file.empty() || !defs.empty() || !description.empty()) {
      std::fprintf(stderr, "videotrain-run: --config builds the whole pipeline: give no -f, -D or pipeline with it\n");
      return 2;
    }
    int rc = run_config(config, dry_run, argv[0], &description);
    if (rc >= 0) return rc;
  } else if (dry_run) {
    std::fprintf(stderr, "videotrain-run: --dry-run goes with --config\n");
    return 2;
  } else if (!file.empty()) {
    std::ifstream f(file);
    if (!f) {
      std::fprintf(stderr, "videotrain-run: cannot read %s\n", file.c_str());
      return 2;
    }
    std::stringstream ss;
    ss << f.rdbuf();
    description = ss.str() + " " + description;
  }
  if (config.empty()) description = substitute(description, defs);
  if (description.find_first_not_of(" \t\n") == std::string::npos) return usage(), 2;
  tty = isatty(fileno(stderr));

  GError *err = nullptr;
  // Without FATAL_ERRORS an unknown property or element is a warning, and the half-built
  // pipeline never reaches EOS.
  pipeline = gst_parse_launch_full(description.c_str(), nullptr, GST_PARSE_FLAG_FATAL_ERRORS, &err);
  if (!pipeline || err) {
    std::fprintf(stderr, "videotrain-run: bad pipeline: %s\n  %s\n", err ? err->message : "?", description.c_str());
    if (err && g_error_matches(err, GST_PARSE_ERROR, GST_PARSE_ERROR_NO_SUCH_ELEMENT)) {
      const char *path = std::getenv("GST_PLUGIN_PATH");
      std::fprintf(stderr, "  (is the plugin installed or GST_PLUGIN_PATH set? GST_PLUGIN_PATH is %s)\n",
                   path ? path : "unset");
    }
    g_clear_error(&err);
    if (pipeline) gst_object_unref(pipeline);
    return 2;
  }
  ClipPrinter printer;
  if (!clip_element.empty()) {
    GstElement *e = gst_bin_get_by_name(GST_BIN(pipeline), clip_element.c_str());
    if (!e) {
      std::fprintf(stderr, "videotrain-run: no element named '%s' in the pipeline\n", clip_element.c_str());
      return 2;
    }
    GstPad *pad = gst_element_get_static_pad(e, "src");
    if (!pad) {
      std::fprintf(stderr, "videotrain-run: element '%s' has no src pad\n", clip_element.c_str());
      return 2;
    }
    gst_pad_add_probe(pad, GST_PAD_PROBE_TYPE_BUFFER, print_clip, &printer, nullptr);
    gst_object_unref(pad);
    gst_object_unref(e);
  }
  loop = g_main_loop_new(nullptr, FALSE);
  GstBus *bus = gst_element_get_bus(pipeline);
  gst_bus_add_watch(bus, on_message, nullptr);
  g_unix_signal_add(SIGINT, on_signal, GINT_TO_POINTER(SIGINT));
  g_unix_signal_add(SIGTERM, on_signal, GINT_TO_POINTER(SIGTERM));
  gint64 t0 = g_get_monotonic_time();
  // Detached: when it is still blocked at exit, the watchdog ends the process.
  starting = true;
  std::thread([p = GST_ELEMENT(gst_object_ref(pipeline))] {
    // Low priority: the error messages on the bus are printed first.
    if (gst_element_set_state(p, GST_STATE_PLAYING) == GST_STATE_CHANGE_FAILURE)
      g_idle_add(on_state_change_failed, nullptr);
    starting = false;
    gst_object_unref(p);
  }).detach();
  g_main_loop_run(loop);
  if (errored) arm_exit_watchdog(exit_code);
  // What the sinks post while stopping (a rescue checkpoint, steps lost) is printed too.
  gst_pipeline_set_auto_flush_bus(GST_PIPELINE(pipeline), FALSE);
  gst_element_set_state(pipeline, GST_STATE_NULL);
  while (GstMessage *m = gst_bus_pop(bus)) {
    if (GST_MESSAGE_TYPE(m) != GST_MESSAGE_EOS) on_message(bus, m, nullptr);
    gst_message_unref(m);
  }
  // Stopped by a signal, even cleanly (final checkpoint written): the conventional 128 + signal,
  // so that job scripts tell it from a finished run.
  if (exit_code == 0 && first_signal) exit_code = 128 + first_signal;
  double secs = (g_get_monotonic_time() - t0) / 1e6;
  if (tty && !status_line.empty()) std::fprintf(stderr, "\n");
  if (!clip_element.empty())
    std::printf("videotrain-run: %" G_GUINT64_FORMAT " clips, %" G_GUINT64_FORMAT " frames in %.3f s (%.1f frames/s)\n",
                printer.clips, printer.frames, secs, secs > 0 ? printer.frames / secs : 0.0);
  else
    std::printf("videotrain-run: finished in %.1f s%s\n", secs,
                first_signal && exit_code == 128 + first_signal ? " (stopped by a signal)"
                : exit_code                                     ? " with an error"
                                                                : "");
  gst_bus_remove_watch(bus);
  gst_object_unref(bus);
  gst_object_unref(pipeline);
  g_main_loop_unref(loop);
  return exit_code;
}
