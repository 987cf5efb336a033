#include "test_util.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <glib.h>
#include <malloc.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace vttest {

TempDir::TempDir() {
  std::string tmpl = env_or("TMPDIR", "/tmp") + "/videotrain-test-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  const char *p = mkdtemp(buf.data());
  path_ = p ? p : "";
}

TempDir::~TempDir() {
  if (path_.empty() || std::getenv("VIDEOTRAIN_KEEP_TEMP")) return;
  std::string cmd = "rm -rf '" + path_ + "'";
  if (std::system(cmd.c_str()) != 0) {
  }
}

StalledFifo::StalledFifo(const std::string &path, bool with_writer, const std::string &prefix) : path_(path) {
  if (mkfifo(path.c_str(), 0600) != 0) {
    ADD_FAILURE() << "mkfifo " << path << ": " << std::strerror(errno);
    return;
  }
  ok_ = true;
  if (!with_writer) return;
  // Read-write: opens at once on Linux, and a writer stays while nobody reads.
  fd_ = open(path.c_str(), O_RDWR | O_CLOEXEC);
  ok_ = fd_ >= 0 && prefix.size() < 65536 &&  // the pipe holds the prefix without a reader
        write(fd_, prefix.data(), prefix.size()) == ssize_t(prefix.size());
  if (!ok_) ADD_FAILURE() << "cannot open or fill the pipe " << path;
}

StalledFifo::~StalledFifo() { release(); }

bool StalledFifo::prefix_read(double timeout_s) const {
  const gint64 end = g_get_monotonic_time() + gint64(timeout_s * G_USEC_PER_SEC);
  for (;;) {
    int queued = -1;
    if (fd_ < 0 || ioctl(fd_, FIONREAD, &queued) != 0) return false;
    if (queued == 0) return true;
    if (g_get_monotonic_time() > end) return false;
    g_usleep(20000);
  }
}

void StalledFifo::release() {
  if (!ok_) return;
  ok_ = false;
  // A reader blocked in open() counts as one: a writer that opens and closes lets it go.
  int w = fd_ >= 0 ? fd_ : open(path_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  fd_ = -1;
  // Whoever opens the path again (filesrc opens twice) finds an empty file, not the pipe.
  unlink(path_.c_str());
  write_file(path_, "");
  if (w >= 0) close(w);
}

std::string env_or(const char *name, const std::string &fallback) {
  const char *v = std::getenv(name);
  return (v && *v) ? std::string(v) : fallback;
}

// tests/reference of the source tree (meson test sets VIDEOTRAIN_REFERENCE_DIR to it).
std::string reference_dir() {
  return env_or("VIDEOTRAIN_REFERENCE_DIR", env_or("VIDEOTRAIN_SOURCE_DIR", ".") + "/tests/reference");
}

std::string heap_keeps_large_blocks() {
  constexpr size_t kBlock = size_t(16) << 20;
  const auto before = mallinfo2();
  struct mallinfo2 during {};
  void *p = nullptr;
  if (posix_memalign(&p, 64, kBlock) != 0) return "cannot allocate 16 MiB";
  std::memset(p, 1, kBlock);
  during = mallinfo2();
  free(p);
  const auto after = mallinfo2();
  if (during.hblkhd != before.hblkhd) return "the 16 MiB block was mmapped on its own";
  if (during.uordblks < before.uordblks + kBlock) return "the heap did not serve the 16 MiB block";
  if (after.arena < during.arena) return "freed memory went back to the OS";
  return "";
}

std::string script_model(const TempDir &dir, const std::string &name, const std::string &source) {
  const std::string py = env_or("PYTHON", "/usr/bin/python3");
  const std::string model = dir.file(name + ".pt"), script = dir.file(name + ".py");
  write_file(script, source);
  if (std::system((py + " " + script + " " + model).c_str()) != 0) {
    ADD_FAILURE() << py << " could not script the test model " << name;
    return "";
  }
  return model;
}

std::string make_script_model(const TempDir &dir) {
  return script_model(dir, "m", R"(
import sys, torch
from typing import List
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv3d(4, 4, 1)
    @torch.jit.export
    def training_step(self, latents: torch.Tensor, captions: List[str]) -> torch.Tensor:
        noise = torch.randn_like(latents)
        return ((self.conv(latents + 0.1 * noise) - latents.flip(1)) ** 2).mean()
    def forward(self, x):
        return self.conv(x)
torch.jit.script(M()).save(sys.argv[1])
)");
}

namespace {
long status_kb(const char *key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) return std::atol(line.c_str() + std::strlen(key));
  return 0;
}
}  // namespace

long rss_kb() { return status_kb("VmRSS:"); }
long peak_rss_kb() { return status_kb("VmHWM:"); }
void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

void nan_into_safetensors(const std::string &path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t header = 0;
  f.read(reinterpret_cast<char *>(&header), 8);
  ASSERT_TRUE(f.good()) << path;
  const uint32_t nan = 0x7fc00000u;
  f.seekp(static_cast<std::streamoff>(8 + header));
  f.write(reinterpret_cast<const char *>(&nan), 4);
  ASSERT_TRUE(f.good()) << path;
}

void write_file(const std::string &path, const std::string &content) {
  std::ofstream f(path, std::ios::binary);
  f << content;
}

std::string read_file(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string run_pipeline(const std::string &description, int timeout_s) {
  GError *err = nullptr;
  GstElement *pipe = gst_parse_launch(description.c_str(), &err);
  if (!pipe) {
    std::string m = err ? err->message : "parse failed";
    g_clear_error(&err);
    return m;
  }
  g_clear_error(&err);  // a recoverable parse warning
  gst_element_set_state(pipe, GST_STATE_PLAYING);
  GstBus *bus = gst_element_get_bus(pipe);
  std::string result;
  GstMessage *msg = gst_bus_timed_pop_filtered(bus, GST_SECOND * timeout_s,
                                               GstMessageType(GST_MESSAGE_EOS | GST_MESSAGE_ERROR));
  if (!msg) {
    result = "timeout after " + std::to_string(timeout_s) + " s";
  } else if (GST_MESSAGE_TYPE(msg) == GST_MESSAGE_ERROR) {
    GError *e = nullptr;
    gchar *dbg = nullptr;
    gst_message_parse_error(msg, &e, &dbg);
    result = std::string(e->message) + " (" + (dbg ? dbg : "") + ")";
    g_clear_error(&e);
    g_free(dbg);
  }
  if (msg) gst_message_unref(msg);
  gst_object_unref(bus);
  gst_element_set_state(pipe, GST_STATE_NULL);
  gst_object_unref(pipe);
  return result;
}

bool make_video(const std::string &path, const VideoSpec &s) {
  // avenc_mpeg4 of gst-libav 1.22 loses timestamps unless a parser follows it; H.264 comes
  // from openh264 (plugins-bad) and VP8 from libvpx (plugins-good).
  std::string enc;
  if (s.container == "mkv" || s.container == "webm")
    enc = "vp8enc deadline=1 keyframe-max-dist=" + std::to_string(s.gop) + " ! " +
          (s.container == "mkv" ? "matroskamux" : "webmmux");
  else if (s.container == "avi")
    enc = "avenc_mpeg4 gop-size=" + std::to_string(s.gop) + " bitrate=2000000 ! mpeg4videoparse ! avimux";
  else
    enc = "openh264enc gop-size=" + std::to_string(s.gop) + " ! h264parse ! mp4mux";
  std::ostringstream d;
  d << "videotestsrc num-buffers=" << s.frames << " pattern=" << s.pattern << " ! video/x-raw,format=I420,width="
    << s.width << ",height=" << s.height << ",framerate=" << s.fps << "/1 ! " << enc << " ! filesink location=\""
    << path << "\"";
  std::string err = run_pipeline(d.str(), 120);
  if (!err.empty()) ADD_FAILURE() << "could not make test video " << path << ": " << err;
  return err.empty();
}

void expect_error(const std::function<void()> &f, const std::string &part) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing: " << part;
  } catch (const std::exception &e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

}  // namespace vttest

// One main for every test binary: GStreamer must be initialised before any test.
int main(int argc, char **argv) {
  gst_init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  // Worker tests are the entry points of spawned ranks (multirank.h), not tests of their own.
  if (!std::getenv("VIDEOTRAIN_TEST_WORKER")) {
    std::string f = ::testing::GTEST_FLAG(filter);
    ::testing::GTEST_FLAG(filter) = f + (f.find('-') == std::string::npos ? "-" : ":") + "*Worker.*";
  }
  return RUN_ALL_TESTS();
}
