/* vaedecoder: one latent tensor buffer per clip in, RGB frames out as they are decoded. */
#pragma once

#include <gst/gst.h>

G_BEGIN_DECLS

#define GST_TYPE_VAE_DECODER (gst_vae_decoder_get_type())
G_DECLARE_FINAL_TYPE(GstVaeDecoder, gst_vae_decoder, GST, VAE_DECODER, GstElement)

GST_ELEMENT_REGISTER_DECLARE(vaedecoder);

G_END_DECLS
