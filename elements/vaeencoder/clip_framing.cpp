/* VaeEngine's clip framing (see push() in vae_engine.h): which frames make a clip, what to do
 * with frames that do not fit, and when a clip is complete. Decides with plain values; the
 * encoding itself is begin_clip/push_frame/finish_clip. */
#include "vae_engine.h"

namespace videotrain::vae {

DroppedClip VaeEngine::drop(const FrameInfo &clip, std::string reason) {
  abort_clip();
  // The rest of the clip's frames are skipped without a warning each.
  framing_.skipping = true;
  framing_.skip_sample = clip.sample_id;
  framing_.skip_clip_index = clip.clip_index;
  return DroppedClip{clip.sample_id, clip.epoch, clip.clip_index, clip.num_frames, std::move(reason)};
}

FrameOutcome VaeEngine::push(const FrameInfo &f, const uint8_t *rgb, size_t stride, size_t bytes) {
  FrameOutcome out;
  Framing &fr = framing_;
  // A failure after begin_clip/push_frame/finish_clip: the engine has given up the clip.
  auto failed = [&](const std::string &why) {
    if (failure_is_settings() || failure_is_fatal()) {
      out.kind = failure_is_settings() ? FrameOutcome::Kind::kSettingsError : FrameOutcome::Kind::kOutOfMemory;
      out.error = why;
      abort_clip();
    } else {
      out.dropped.push_back(drop(fr.clip, why));
    }
    return std::move(out);
  };

  if (f.frame_index == 0) {
    fr.skipping = false;
    if (in_clip()) {
      out.dropped.push_back(drop(fr.clip, "clip ended after " + std::to_string(frames_received()) + " of " +
                                              std::to_string(frames_expected()) + " frames (the next clip started)"));
      fr.skipping = false;
    }
    fr.clip = f;
    fr.end = GST_CLOCK_TIME_NONE;
    std::string why;
    if (!begin_clip(f.sample_id, static_cast<int>(f.num_frames), f.width, f.height, &why, f.epoch))
      return failed(why);
  } else if (!in_clip()) {
    const bool known = fr.skipping && f.sample_id == fr.skip_sample && f.clip_index == fr.skip_clip_index;
    if (!known)  // joined in the middle of a clip (e.g. after a flush)
      out.dropped.push_back(
          drop(f, "clip started at frame " + std::to_string(f.frame_index) + ", not at frame 0"));
    return out;
  } else if (f.sample_id != fr.clip.sample_id || f.clip_index != fr.clip.clip_index ||
             static_cast<int>(f.frame_index) != frames_received() ||
             static_cast<int>(f.num_frames) != frames_expected()) {
    out.dropped.push_back(drop(fr.clip, "frame " + std::to_string(f.frame_index) + " of sample " +
                                            std::to_string(f.sample_id) + " arrived where frame " +
                                            std::to_string(frames_received()) + " of the current clip was expected"));
    return out;
  }

  if (!rgb) {
    out.dropped.push_back(drop(fr.clip, "frame " + std::to_string(f.frame_index) + " has " + std::to_string(bytes) +
                                            " bytes, too few for " + std::to_string(f.width) + "x" +
                                            std::to_string(f.height) + " RGB"));
    return out;
  }
  std::string why;
  if (!push_frame(rgb, stride, &why)) return failed(why);
  if (GST_CLOCK_TIME_IS_VALID(f.pts)) fr.end = f.pts + (GST_CLOCK_TIME_IS_VALID(f.duration) ? f.duration : 0);
  if (!clip_complete()) return out;

  out.latent = finish_clip(&why);
  if (!out.latent) return failed(why);
  out.kind = FrameOutcome::Kind::kLatent;
  out.clip = fr.clip;
  out.pts = fr.clip.pts;
  if (GST_CLOCK_TIME_IS_VALID(fr.clip.pts) && GST_CLOCK_TIME_IS_VALID(fr.end) && fr.end >= fr.clip.pts)
    out.duration = fr.end - fr.clip.pts;
  return out;
}

std::optional<DroppedClip> VaeEngine::end_of_stream() {
  if (!in_clip()) return std::nullopt;
  return drop(framing_.clip, "stream ended after " + std::to_string(frames_received()) + " of " +
                                 std::to_string(frames_expected()) + " frames of the clip");
}

std::optional<DroppedClip> VaeEngine::frame_size_changed(int width, int height) {
  if (!in_clip() || (width == framing_.clip.width && height == framing_.clip.height)) return std::nullopt;
  return drop(framing_.clip, "frame size changed to " + std::to_string(width) + "x" + std::to_string(height) +
                                 " in the middle of the clip (after frame " + std::to_string(frames_received()) + ")");
}

void VaeEngine::reset_framing() {
  abort_clip();
  framing_ = Framing();
}

}  // namespace videotrain::vae
