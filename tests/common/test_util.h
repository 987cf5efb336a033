/* Shared test helpers: GStreamer set-up, temporary folders, generated test videos. */
#pragma once

#include <gst/gst.h>

#include <functional>
#include <string>
#include <vector>

namespace vttest {

// A fresh folder under $TMPDIR, removed (recursively) when the object goes away.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir &) = delete;
  TempDir &operator=(const TempDir &) = delete;
  const std::string &path() const { return path_; }
  std::string file(const std::string &name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct VideoSpec {
  int frames = 30;
  int width = 64;
  int height = 48;
  int fps = 10;
  int gop = 10;                    // keyframe interval
  std::string pattern = "smpte";  // videotestsrc pattern
  std::string container = "mp4";  // mp4 (H.264) | mkv, webm (VP8) | avi (MPEG-4 part 2)
};

// Encodes a test video with GStreamer itself (videotestsrc, an encoder, a muxer).
// Fails the current test (ADD_FAILURE) and returns false when encoding fails.
bool make_video(const std::string &path, const VideoSpec &spec = {});

void write_file(const std::string &path, const std::string &content);
std::string read_file(const std::string &path);

// Runs a gst-launch style description to EOS or error; returns the error text ("" on success).
std::string run_pipeline(const std::string &description, int timeout_s = 60);

// DIR/NAME.pt, saved by `source` (a Python script that takes the path as argv[1]) run with
// Debian's python3-torch ($PYTHON). "" (with a test failure) when python fails.
std::string script_model(const TempDir &dir, const std::string &name, const std::string &source);

// A TorchScript model made by script_model() into DIR/m.pt: one 1x1x1 Conv3d over 4
// channels, whose training_step draws noise from torch's default generator and which has
// no validation_step.
std::string make_script_model(const TempDir &dir);

// Overwrites the first float of a safetensors file's data with a NaN: same length, still
// readable, so only a checksum or a finite check finds it.
void nan_into_safetensors(const std::string &path);

// A named pipe standing for a video on a stalled mount. With a writer (this object keeps
// it open read-write), readers open it and read `prefix`, then read() blocks; without one,
// open() for reading blocks. release() (also at destruction) lets every reader go: they
// see the end of the file, and the path becomes an empty file.
class StalledFifo {
 public:
  StalledFifo(const std::string &path, bool with_writer, const std::string &prefix = "");
  ~StalledFifo();
  StalledFifo(const StalledFifo &) = delete;
  StalledFifo &operator=(const StalledFifo &) = delete;
  bool ok() const { return ok_; }
  // With a writer and a prefix: true once a reader has taken the prefix (its next read blocks).
  bool prefix_read(double timeout_s) const;
  void release();

 private:
  std::string path_;
  int fd_ = -1;
  bool ok_ = false;
};

// This process's resident memory now (VmRSS) and its peak (VmHWM), in KiB; reset_peak_rss()
// sets the peak back to the current size (Linux 4.0+: clear_refs 5).
long rss_kb();
long peak_rss_kb();
void reset_peak_rss();

// Environment variable with a default.
std::string env_or(const char *name, const std::string &fallback);

// tests/reference (VIDEOTRAIN_REFERENCE_DIR).
std::string reference_dir();

// What tune-malloc (retain_cpu_heap) promises, checked with a 16 MiB block: the heap
// serves it (no mmap of its own) and keeps its memory when it is freed. "" when it
// holds, else what went wrong.
std::string heap_keeps_large_blocks();

// Runs f; fails the current test unless it throws a std::exception whose message contains `part`.
void expect_error(const std::function<void()> &f, const std::string &part);

}  // namespace vttest
