/* samplesink's properties in one struct, whose defaults the property specs read. No torch, no
 * GStreamer. */
#pragma once

#include <string>

namespace videotrain {

struct SampleSinkSettings {
  std::string location = "samples/step-%08d/prompt-%02d.mp4";  // sample_names.h
  // MPEG-4 part 2 at a fixed quantiser: libopenh264 prints an error line (cmInitParaError) at every
  // end-of-stream flush, one per sample file, which hid real messages; H.264 stays one property away
  // (encoder=).
  std::string encoder =
      "videoconvert ! video/x-raw,format=I420 ! avenc_mpeg4 pass=quant quantizer=2 max-bframes=0 ! mp4mux";
  std::string trainer;               // the ddptrainsink whose TensorBoard events get frames; "": none
  unsigned tensorboard_frames = 3;   // frames per sample sent there
  bool fail_on_error = false;        // a sample that cannot be written stops the branch
};

}  // namespace videotrain
