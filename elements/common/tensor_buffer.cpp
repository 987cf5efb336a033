#include "tensor_buffer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "first_line.h"
#include "tensor_caps.h"

namespace {

constexpr const char *kMemType = "VideoTrainTensor";

struct TensorMemory {
  GstMemory mem;
  at::Tensor tensor;      // owns the data
  at::Tensor host;        // host copy for maps of device tensors
  std::mutex host_lock;
};

struct VideoTrainTensorAllocator {
  GstAllocator parent;
};
struct VideoTrainTensorAllocatorClass {
  GstAllocatorClass parent_class;
};

GType tensor_allocator_get_type();

gpointer tensor_mem_map(GstMemory *mem, gsize, GstMapFlags flags) {
  auto *tm = reinterpret_cast<TensorMemory *>(mem);
  if (tm->tensor.device().is_cpu()) return tm->tensor.data_ptr();
  if (flags & GST_MAP_WRITE) return nullptr;  // device memory is not writable through a map
  std::lock_guard<std::mutex> g(tm->host_lock);
  if (!tm->host.defined()) tm->host = tm->tensor.to(at::kCPU).contiguous();
  return tm->host.data_ptr();
}

void tensor_mem_unmap(GstMemory *) {}

GstMemory *tensor_mem_share(GstMemory *, gssize, gssize) { return nullptr; }

// A copy is plain system memory holding the bytes (the tensor meta keeps the shape).
GstMemory *tensor_mem_copy(GstMemory *mem, gssize offset, gssize size) {
  if (size < 0) size = mem->size - offset;
  GstMapInfo in;
  if (!gst_memory_map(mem, &in, GST_MAP_READ)) return nullptr;
  GstMemory *out = gst_allocator_alloc(nullptr, size, nullptr);
  GstMapInfo o;
  if (gst_memory_map(out, &o, GST_MAP_WRITE)) {
    memcpy(o.data, in.data + offset, size);
    gst_memory_unmap(out, &o);
  }
  gst_memory_unmap(mem, &in);
  return out;
}

void tensor_alloc_free(GstAllocator *, GstMemory *mem) {
  auto *tm = reinterpret_cast<TensorMemory *>(mem);
  tm->~TensorMemory();
  g_slice_free1(sizeof(TensorMemory), tm);
}

GstMemory *tensor_alloc_alloc(GstAllocator *, gsize, GstAllocationParams *) { return nullptr; }

void tensor_allocator_class_init(gpointer klass, gpointer) {
  auto *ac = GST_ALLOCATOR_CLASS(klass);
  ac->alloc = tensor_alloc_alloc;
  ac->free = tensor_alloc_free;
}

void tensor_allocator_init(GTypeInstance *inst, gpointer) {
  auto *a = GST_ALLOCATOR(inst);
  a->mem_type = kMemType;
  a->mem_map = tensor_mem_map;
  a->mem_unmap = tensor_mem_unmap;
  a->mem_share = tensor_mem_share;
  a->mem_copy = tensor_mem_copy;
  GST_OBJECT_FLAG_SET(a, GST_ALLOCATOR_FLAG_CUSTOM_ALLOC);
}

GType tensor_allocator_get_type() {
  static gsize once = 0;
  if (g_once_init_enter(&once)) {
    // Another copy of this code (test binary vs plugin) may have registered it.
    GType t = g_type_from_name("GstVideoTrainTensorAllocator");
    if (!t)
      t = g_type_register_static_simple(GST_TYPE_ALLOCATOR, "GstVideoTrainTensorAllocator",
                                            sizeof(VideoTrainTensorAllocatorClass), tensor_allocator_class_init,
                                            sizeof(VideoTrainTensorAllocator), tensor_allocator_init,
                                            GTypeFlags(0));
    g_once_init_leave(&once, t);
  }
  return (GType)once;
}

GstAllocator *tensor_allocator() {
  static GstAllocator *alloc = [] {
    auto *a = GST_ALLOCATOR(g_object_new(tensor_allocator_get_type(), nullptr));
    gst_object_ref_sink(a);
    GST_OBJECT_FLAG_SET(a, GST_OBJECT_FLAG_MAY_BE_LEAKED);
    return a;
  }();
  return alloc;
}

}  // namespace

namespace videotrain {

const char *dtype_name(c10::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    case at::kByte: return "uint8";
    default: return c10::toString(t);
  }
}

std::optional<c10::ScalarType> dtype_from_name(const std::string &n) {
  if (n == "float32") return at::kFloat;
  if (n == "bfloat16") return at::kBFloat16;
  if (n == "float16") return at::kHalf;
  return std::nullopt;
}

std::string device_name(const c10::Device &d) {
  if (d.is_cpu()) return "cpu";
  return d.str();  // "cuda:0"
}

bool is_tensor_memory(GstMemory *mem) { return mem && gst_memory_is_type(mem, kMemType); }

namespace {

GstMemory *wrap_tensor(const at::Tensor &c) {
  auto *tm = static_cast<TensorMemory *>(g_slice_alloc(sizeof(TensorMemory)));
  new (tm) TensorMemory();
  tm->tensor = c;
  gsize size = c.numel() * c.element_size();
  gst_memory_init(&tm->mem, GST_MEMORY_FLAG_NO_SHARE, tensor_allocator(), nullptr, size, 0, 0, size);
  return &tm->mem;
}

// The tensor a meta describes: the wrapped tensor when a memory of ours starts at its offset
// and holds its elements, else a CPU tensor rebuilt from the bytes there.
std::optional<at::Tensor> tensor_at(GstBuffer *buf, const GstVideoTrainTensorMeta *meta, std::string *why) {
  auto shape = tensor_meta_shape(meta);
  gsize start = 0;
  for (guint i = 0, n = gst_buffer_n_memory(buf); i < n; i++) {
    GstMemory *mem = gst_buffer_peek_memory(buf, i);
    if (start == meta->offset && is_tensor_memory(mem)) {
      at::Tensor t = reinterpret_cast<TensorMemory *>(mem)->tensor;
      if (t.numel() == c10::multiply_integers(shape)) return t.view(shape);
      if (n == 1 && meta->name[0] == '\0') return t;
    }
    start += mem->size;
  }
  auto dt = dtype_from_name(meta->dtype);
  if (!dt && std::string(meta->dtype) == "int64") dt = at::kLong;
  if (!dt && std::string(meta->dtype) == "uint8") dt = at::kByte;
  if (!dt) {
    if (why) *why = std::string("unknown dtype '") + meta->dtype + "' in tensor meta";
    return std::nullopt;
  }
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(*dt));
  gsize need = t.numel() * t.element_size();
  const gsize size = gst_buffer_get_size(buf);
  const bool alone = meta->name[0] == '\0' && tensor_names(buf).empty();
  if (alone ? size != need : size < meta->offset + need) {
    if (why)
      *why = "buffer holds " + std::to_string(size) + " bytes, tensor meta" +
             (meta->name[0] ? std::string(" '") + meta->name + "'" : std::string()) + " needs " +
             std::to_string(need) + (meta->offset ? " at offset " + std::to_string(meta->offset) : std::string());
    return std::nullopt;
  }
  gst_buffer_extract(buf, meta->offset, t.data_ptr(), need);
  return t;
}

}  // namespace

GstBuffer *buffer_from_tensor(const at::Tensor &t) {
  at::Tensor c = t.contiguous();
  GstBuffer *buf = gst_buffer_new();
  gst_buffer_append_memory(buf, wrap_tensor(c));
  add_tensor_meta(buf, dtype_name(c.scalar_type()), device_name(c.device()), c.sizes().vec());
  return buf;
}

void buffer_append_tensor(GstBuffer *buf, const std::string &name, const at::Tensor &t) {
  at::Tensor c = t.contiguous();
  const gsize offset = gst_buffer_get_size(buf);
  gst_buffer_append_memory(buf, wrap_tensor(c));
  add_tensor_meta(buf, c.scalar_type() == at::kLong ? "int64" : dtype_name(c.scalar_type()), device_name(c.device()),
                  c.sizes().vec(), name, offset);
}

bool buffer_remove_tensor(GstBuffer *buf, const std::string &name) {
  GstVideoTrainTensorMeta *meta = name.empty() ? nullptr : find_tensor_meta(buf, name);
  if (!meta) return false;
  const gsize start = meta->offset, size = gst_videotrain_tensor_meta_get_nbytes(meta);
  // The memories that hold exactly its bytes (one, as buffer_append_tensor made it) go; when a copy
  // merged memories, the buffer's bytes are rebuilt without them.
  guint first = 0, count = 0;
  gsize at = 0, covered = 0;
  bool found = false;
  for (guint i = 0, n = gst_buffer_n_memory(buf); i < n; i++) {
    const gsize ms = gst_buffer_peek_memory(buf, i)->size;
    if (at == start) found = true, first = i;
    if (found && covered < size) count++, covered += ms;
    at += ms;
  }
  if (found && covered == size) {
    if (count > 0) gst_buffer_remove_memory_range(buf, first, count);
  } else {
    GstMapInfo m;
    if (!gst_buffer_map(buf, &m, GST_MAP_READ)) return false;
    const gsize total = m.size, end = std::min(total, start + size);
    GstMemory *mem = gst_allocator_alloc(nullptr, total - (end - start), nullptr);
    GstMapInfo w;
    gst_memory_map(mem, &w, GST_MAP_WRITE);
    std::memcpy(w.data, m.data, start);
    std::memcpy(w.data + start, m.data + end, total - end);
    gst_memory_unmap(mem, &w);
    gst_buffer_unmap(buf, &m);
    gst_buffer_replace_all_memory(buf, mem);
  }
  gst_buffer_remove_meta(buf, &meta->meta);
  gpointer state = nullptr;
  while (GstMeta *mm = gst_buffer_iterate_meta_filtered(buf, &state, GST_VIDEOTRAIN_TENSOR_META_API_TYPE)) {
    auto *tm = reinterpret_cast<GstVideoTrainTensorMeta *>(mm);
    if (tm->offset > start) tm->offset -= size;
  }
  return true;
}

std::optional<at::Tensor> tensor_from_buffer(GstBuffer *buf, std::string *why) {
  auto *meta = find_tensor_meta(buf, "");
  if (!meta) {
    if (gst_buffer_n_memory(buf) == 1 && is_tensor_memory(gst_buffer_peek_memory(buf, 0)))
      return reinterpret_cast<TensorMemory *>(gst_buffer_peek_memory(buf, 0))->tensor;
    if (why) *why = "buffer has neither tensor memory nor a tensor meta (shape and dtype unknown)";
    return std::nullopt;
  }
  return tensor_at(buf, meta, why);
}

std::optional<at::Tensor> named_tensor_from_buffer(GstBuffer *buf, const std::string &name, std::string *why) {
  auto *meta = find_tensor_meta(buf, name);
  if (!meta) {
    if (why) *why = "buffer has no tensor named '" + name + "'";
    return std::nullopt;
  }
  return tensor_at(buf, meta, why);
}

bool text_tensors_from_buffer(GstBuffer *buf, at::Tensor *embeds, at::Tensor *mask, std::string *why) {
  const std::pair<const char *, at::Tensor *> wanted[] = {{"text_embeds", embeds}, {"text_mask", mask}};
  for (const auto &[name, out] : wanted) {
    if (!find_tensor_meta(buf, name)) continue;
    std::string err;
    auto t = named_tensor_from_buffer(buf, name, &err);
    if (!t) {
      *why = std::string("tensor '") + name + "' cannot be read: " + err;
      return false;
    }
    *out = *t;
  }
  if (embeds->defined() != mask->defined()) {
    *why = "the buffer carries only one of text_embeds and text_mask";
    return false;
  }
  return true;
}

CachedTensor cached_tensor_of(const std::string &name, const at::Tensor &t) {
  const at::Tensor c = t.detach().to(at::kCPU).contiguous();
  CachedTensor out;
  out.name = name;
  out.dtype = c.scalar_type() == at::kLong ? "int64" : dtype_name(c.scalar_type());
  out.shape = c.sizes().vec();
  out.bytes.assign(static_cast<const char *>(c.data_ptr()), c.numel() * c.element_size());
  return out;
}

std::optional<at::Tensor> tensor_of_cached(const CachedTensor &c, std::string *why) {
  const auto type = c.dtype == "int64"   ? std::optional<c10::ScalarType>(at::kLong)
                    : c.dtype == "uint8" ? std::optional<c10::ScalarType>(at::kByte)
                                         : dtype_from_name(c.dtype);
  if (!type) {
    *why = "tensor " + c.name + " has dtype '" + c.dtype + "'";
    return std::nullopt;
  }
  // The byte count first: a declared shape allocates nothing until the bytes are there for it.
  const uint64_t es = c10::elementSize(*type);
  uint64_t n = es;
  for (int64_t d : c.shape) {
    if (d < 0 || (d > 0 && n > UINT64_MAX / static_cast<uint64_t>(d))) {
      *why = "tensor " + c.name + " has a bad shape";
      return std::nullopt;
    }
    n *= static_cast<uint64_t>(d);
  }
  if (n != c.bytes.size()) {
    *why = "tensor " + c.name + " holds " + std::to_string(c.bytes.size()) + " bytes for its shape's " +
           std::to_string(n);
    return std::nullopt;
  }
  try {
    at::Tensor t = at::empty(c.shape, at::TensorOptions().dtype(*type));
    std::memcpy(t.data_ptr(), c.bytes.data(), c.bytes.size());
    return t;
  } catch (const std::exception &e) {
    *why = "tensor " + c.name + ": " + first_line(e.what());
    return std::nullopt;
  }
}

}  // namespace videotrain
