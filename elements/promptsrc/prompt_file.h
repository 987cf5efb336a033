/* Prompt files for sampling branches (promptsrc): one prompt a line, or a CSV whose header names
 * its columns (prompt, negative_prompt, seed, num_frames, width, height, image, last_image). Read through the
 * project's bounded open (a FIFO or device is refused) with a size cap. No torch, no GStreamer. */
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace videotrain {

struct Prompt {
  uint32_t index = 0;     // position in the file, from 0
  std::string text;
  std::string negative;   // "" when the file gives none
  int64_t seed = -1;      // -1: not given (the sampler's `seed` applies)
  int64_t frames = 0;     // 0: not given (the sampler's num-frames, width, height apply)
  int64_t width = 0;
  int64_t height = 0;
  // Image-to-video: the first frame's image file (FLF2V: also the last's), relative paths resolved
  // against the prompt file's folder; "" when not given.
  std::string image, last_image;
  size_t line = 0;        // the file's line the prompt starts on (messages)
};

struct PromptFileLimits {
  uint64_t max_file_bytes = 64u << 20;
  size_t max_prompt_bytes = 16384;  // longer prompts are cut at a UTF-8 boundary, with a warning
  size_t max_prompts = 100000;
};

// Reads a prompt file from an open regular file of `size` bytes. Lines: blank lines and lines starting with '#' are skipped. CSV: the
// first non-blank line is a header of known column names (case-insensitive; `prompt` required).
// False with *error naming the line and column of a bad value, or saying the file has no prompt.
bool read_prompts(int fd, uint64_t size, const PromptFileLimits &limits, std::vector<Prompt> *out,
                  std::vector<std::string> *warnings, std::string *error);
// Opens and parses a file (bounded: not a regular file, too large, not UTF-8 are errors naming it).
bool read_prompt_file(const std::string &path, const PromptFileLimits &limits, std::vector<Prompt> *out,
                      std::vector<std::string> *warnings, std::string *error);

}  // namespace videotrain
