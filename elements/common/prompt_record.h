/* What a promptsrc buffer holds besides its sample meta (caption = the text): the main tensor,
 * int64 [6], describes the prompt. ddpsampler reads it back after textencoder has added the
 * embedding. No torch, no GStreamer. */
#pragma once

#include <cstdint>

namespace videotrain {

enum PromptField : int {
  kPromptIndex = 0,   // position in the prompt file
  kPromptRole = 1,    // kRolePrompt or kRoleNegative
  kPromptSeed = 2,    // -1: the sampler's seed
  kPromptFrames = 3,  // 0: the sampler's num-frames (likewise width and height)
  kPromptWidth = 4,
  kPromptHeight = 5,
  kPromptFields = 6,
};
enum PromptRole : int64_t { kRolePrompt = 0, kRoleNegative = 1 };

#define VIDEOTRAIN_PROMPT_CONTENT "prompts"
/* A custom query a sampler sends downstream at start: a vaedecoder answers with the latent
 * channels it takes (int "channels"), its pixels per latent ("spatial") and family ("family"). */
#define VIDEOTRAIN_LATENT_QUERY "videotrain-latent-channels"

}  // namespace videotrain
