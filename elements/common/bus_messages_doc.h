// What each element posts on the bus, appended to its gst-inspect description so that the
// fields an app reads are documented where it looks first. The README's "Bus messages" table
// says the same; tests/plugin/bus_messages_doc.py checks the messages a real run posts
// against these texts.
#pragma once

#define VIDEOTRAIN_DOC_CSVVIDEOSRC_MESSAGES                                                                   \
  "\n\nBus messages:\n"                                                                                        \
  "  csvvideosrc-epoch (element message, after an epoch's last frame): epoch (uint), clips (guint64), "       \
  "replaced (guint64), decoded (guint64: clips decoded), cached (guint64: clips a vaeencoder cache held, "     \
  "sent without decoding), manifest (string: the manifest's file name and split, message only).\n"              \
  "  csvvideosrc-replaced (the details structure of a warning, once per bad row and epoch): row (guint64), "   \
  "path (string), reason (string), epoch (uint), clip (guint64).\n"                                             \
  "Downstream events: csvvideosrc-epoch (serialized custom event, same fields) after an epoch's last frame; " \
  "videotrain-cached-clip (serialized custom event) in place of the frames of a clip that vaeencoder's cache " \
  "holds."

#define VIDEOTRAIN_DOC_VAEENCODER_MESSAGES                                                                     \
  "\n\nBus messages:\n"                                                                                        \
  "  vaeencoder-dropped (element message, with a warning): sample-id (guint64), reason (string), epoch "      \
  "(uint), clip-index (guint64), num-frames (uint)."

#define VIDEOTRAIN_DOC_MICROBATCHER_MESSAGES                                                                   \
  "\n\nBus messages: none of its own (errors and warnings only). Steps close at batch-size samples, at the "  \
  "csvvideosrc-epoch event and at EOS."

#define VIDEOTRAIN_DOC_DDPTRAINSINK_MESSAGES                                                                   \
  "\n\nBus messages (every rank posts its own):\n"                                                             \
  "  ddptrainsink-step (element message, every log-every steps): step (guint64), epoch (uint), loss (double), " \
  "lr (double), grad-norm (double), samples-per-second (double), data-wait (double, 0-1: the share of the "   \
  "step spent waiting for data), skipped (boolean: the step was skipped for a non-finite loss or gradient), "  \
  "max-steps (guint64, 0: none), steps-per-second (double, smoothed over the logged steps; 0 at the first), " \
  "eta-seconds (double: the time left to max-steps at that rate; absent without max-steps or a rate).\n"      \
  "  ddptrainsink-checkpoint (element message): step (guint64), path (string), rescue (boolean, present and "  \
  "true for a rescue checkpoint).\n"                                                                           \
  "  ddptrainsink-export (element message, rank 0, a native model's finished run): step (guint64), path "      \
  "(string: the diffusers folder written), dtype (string), ema (boolean: only for export-ema's EMA export).\n" \
  "Warnings: skipped steps, a changed schedule on resume, metrics-file problems, lost steps."

#define VIDEOTRAIN_DOC_DDPVALSINK_MESSAGES                                                                     \
  "\n\nBus messages:\n"                                                                                        \
  "  ddpvalsink-result (element message, rank 0 only, after each pass): step (guint64), loss (double: mean "   \
  "over the validation set), samples (guint64), seconds (double).\n"                                           \
  "  ddpvalsink-skipped (element message, skip-if-busy=true, a step that some rank's validators joined "      \
  "too late to see, or a pass its source's EOS cut short or left undone): step (guint64), text (string).\n"   \
  "Warnings: a pass with no samples, training waiting for validation, metrics-file problems."

#define VIDEOTRAIN_DOC_TEXTENCODER_MESSAGES                                                                    \
  "\n\nBus messages:\n"                                                                                         \
  "  textencoder-summary (element message, at EOS): captions (guint64: answered), encoded (guint64: run "      \
  "through the encoder), cache-reads (guint64: from cache-dir), dropped (guint64: samples given the empty "    \
  "caption by caption-dropout), encoder-loaded (gboolean: false when a folder encoder was never loaded "       \
  "because cache-dir held every caption).\n"                                                                   \
  "Warnings: latents without a sample meta, cache-dir problems."

#define VIDEOTRAIN_DOC_IMAGEENCODER_MESSAGES                                                                   \
  "\n\nBus messages:\n"                                                                                         \
  "  imageencoder-summary (element message, at EOS): clips (guint64: answered), encoded (guint64: run "       \
  "through the encoder), cache-reads (guint64: from cache-dir), encoder-loaded (gboolean: false when "          \
  "cache-dir held every clip's embeddings).\n"                                                                 \
  "Warnings: cache-dir problems."

#define VIDEOTRAIN_DOC_PROMPTSRC_MESSAGES                                                                      \
  "\n\nBus messages: none of its own (a warning per prompt cut at max-prompt-bytes; an error naming the "     \
  "file and line when the prompt file cannot be used)."

#define VIDEOTRAIN_DOC_DDPSAMPLER_MESSAGES                                                                     \
  "\n\nBus messages (every rank posts its own):\n"                                                             \
  "  ddpsampler-sample (element message, after each sample): step (guint64), prompt (uint: index in the "     \
  "prompt file), seed (gint64), num-frames (int), width (int), height (int), sampler (string), seconds "       \
  "(double), prompt-text (string).\n"                                                                          \
  "  ddpsampler-skipped (element message, skip-if-busy=true): step (guint64), text (string).\n"               \
  "Downstream events: ddpsampler-sample (serialized custom event, the fields above but seconds and "           \
  "prompt-text) before each sample's latents.\n"                                                               \
  "Warnings: prompts without a negative, sizes the VAE cannot take, a sampler that took no snapshot."

#define VIDEOTRAIN_DOC_SAMPLESINK_MESSAGES                                                                     \
  "\n\nBus messages:\n"                                                                                        \
  "  samplesink-file (element message, each file completed): path (string), step (guint64), prompt (uint), "  \
  "frames (guint64)."
