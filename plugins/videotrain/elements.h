/* Element registration entry points, one per element folder. */
#pragma once
#include <gst/gst.h>

G_BEGIN_DECLS
GST_ELEMENT_REGISTER_DECLARE(csvvideosrc);
GST_ELEMENT_REGISTER_DECLARE(vaeencoder);
GST_ELEMENT_REGISTER_DECLARE(vaedecoder);
GST_ELEMENT_REGISTER_DECLARE(textencoder);
GST_ELEMENT_REGISTER_DECLARE(imageencoder);
GST_ELEMENT_REGISTER_DECLARE(microbatcher);
GST_ELEMENT_REGISTER_DECLARE(ddptrainsink);
GST_ELEMENT_REGISTER_DECLARE(ddpvalsink);
GST_ELEMENT_REGISTER_DECLARE(promptsrc);
GST_ELEMENT_REGISTER_DECLARE(ddpsampler);
GST_ELEMENT_REGISTER_DECLARE(samplesink);
G_END_DECLS
