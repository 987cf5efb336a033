/* vaeencoder: RGB frames with clip metas in, one latent tensor buffer per clip out. */
#pragma once

#include <gst/gst.h>

G_BEGIN_DECLS

#define GST_TYPE_VAE_ENCODER (gst_vae_encoder_get_type())
G_DECLARE_FINAL_TYPE(GstVaeEncoder, gst_vae_encoder, GST, VAE_ENCODER, GstElement)

GST_ELEMENT_REGISTER_DECLARE(vaeencoder);

G_END_DECLS
