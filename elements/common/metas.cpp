#include "metas.h"

namespace videotrain {

bool read_batch_meta(GstBuffer *buffer, BatchInfo *out) {
  const GstVideoTrainBatchMeta *m = gst_buffer_get_videotrain_batch_meta(buffer);
  if (!m) return false;
  BatchInfo b;
  b.step = m->step;
  b.micro_index = m->micro_index;
  b.micro_count = m->micro_count;
  b.step_samples = m->step_samples;
  b.sync = m->sync;
  b.epoch = m->epoch;
  b.next_clip = m->next_clip;
  const guint n = m->sample_ids->len;
  for (guint i = 0; i < n; i++) {
    b.sample_ids.push_back(g_array_index(m->sample_ids, guint64, i));
    const auto *caption = static_cast<const char *>(g_ptr_array_index(m->captions, i));
    b.captions.emplace_back(caption ? caption : "");
    b.padding.push_back(g_array_index(m->padding, gboolean, i));
    b.clip_indices.push_back(g_array_index(m->clip_indices, guint64, i));
    b.epochs.push_back(g_array_index(m->epochs, guint, i));
  }
  *out = std::move(b);
  return true;
}

bool read_sample_meta(GstBuffer *buffer, SampleInfo *out) {
  const GstVideoTrainSampleMeta *m = gst_buffer_get_videotrain_sample_meta(buffer);
  if (!m) return false;
  out->sample_id = m->sample_id;
  out->epoch = m->epoch;
  out->clip_index = m->clip_index;
  out->padding = m->padding;
  out->group = m->group;
  out->group_size = m->group_size;
  out->caption = m->caption ? m->caption : "";
  out->path = m->path ? m->path : "";
  return true;
}

GstVideoTrainBatchMeta *write_batch_meta(GstBuffer *buffer, const BatchInfo &info) {
  GstVideoTrainBatchMeta *m = gst_buffer_add_videotrain_batch_meta(buffer);
  if (!m) return nullptr;
  m->step = info.step;
  m->micro_index = info.micro_index;
  m->micro_count = info.micro_count;
  m->step_samples = info.step_samples;
  m->sync = info.sync;
  m->epoch = info.epoch;
  m->next_clip = info.next_clip;
  for (size_t i = 0; i < info.sample_ids.size(); i++) {
    const auto at = [&](const auto &v, auto fallback) { return i < v.size() ? v[i] : fallback; };
    gst_videotrain_batch_meta_append(m, info.sample_ids[i], at(info.epochs, info.epoch), at(info.clip_indices, uint64_t{0}),
                                     i < info.captions.size() ? info.captions[i].c_str() : "", at(info.padding, false));
  }
  return m;
}

}  // namespace videotrain
