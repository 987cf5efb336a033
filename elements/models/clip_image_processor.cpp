/* CLIP image processor: see clip_image_processor.h. */
#include "clip_image_processor.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "regular_file.h"

namespace videotrain::models {

namespace {

double bilinear(double x) {
  x = std::abs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

double bicubic(double x) {  // Keys' cubic convolution with a = -0.5, as PIL
  constexpr double a = -0.5;
  x = std::abs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}

// 8-bit results with 2 bits of headroom for the negative lobes' over- and undershoot.
constexpr int kPrecisionBits = 32 - 8 - 2;

// For each output position: the first input index and the fixed-point weights of the inputs it reads.
struct Taps {
  int64_t ksize = 0;
  std::vector<int64_t> first, count;
  std::vector<int64_t> weights;  // out x ksize
};

Taps taps(int64_t in, int64_t out, int resample) {
  const double base = resample == 2 ? 1.0 : 2.0;
  double (*filter)(double) = resample == 2 ? bilinear : bicubic;
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  const double filterscale = std::max(scale, 1.0), support = base * filterscale, inv = 1.0 / filterscale;
  Taps t;
  t.ksize = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  t.first.resize(out);
  t.count.resize(out);
  t.weights.assign(out * t.ksize, 0);
  std::vector<double> w(t.ksize);
  for (int64_t o = 0; o < out; o++) {
    const double center = (o + 0.5) * scale;
    // PIL rounds the window's ends by truncating x + 0.5 (C's int cast).
    const int64_t lo = std::max<int64_t>(static_cast<int64_t>(center - support + 0.5), 0);
    const int64_t hi = std::min<int64_t>(static_cast<int64_t>(center + support + 0.5), in);
    double sum = 0;
    for (int64_t i = 0; i < hi - lo; i++) sum += (w[i] = filter((i + lo - center + 0.5) * inv));
    for (int64_t i = 0; i < hi - lo; i++) {
      const double k = sum != 0.0 ? w[i] / sum : w[i];
      t.weights[o * t.ksize + i] = static_cast<int64_t>(k * (1 << kPrecisionBits) + (k < 0 ? -0.5 : 0.5));
    }
    t.first[o] = lo;
    t.count[o] = hi - lo;
  }
  return t;
}

// One pass along the axis of `stride` (in elements between neighbours): out[o] from in[first..].
void pass(const uint8_t *in, uint8_t *out, int64_t lines, int64_t in_line, int64_t out_line, int64_t stride,
          int64_t out_stride, int64_t channels, const Taps &t, int64_t outs) {
  for (int64_t l = 0; l < lines; l++)
    for (int64_t o = 0; o < outs; o++)
      for (int64_t c = 0; c < channels; c++) {
        int64_t acc = int64_t{1} << (kPrecisionBits - 1);
        const int64_t *k = &t.weights[o * t.ksize];
        const uint8_t *src = in + l * in_line + t.first[o] * stride + c;
        for (int64_t i = 0; i < t.count[o]; i++) acc += src[i * stride] * k[i];
        out[l * out_line + o * out_stride + c] = static_cast<uint8_t>(std::clamp<int64_t>(acc >> kPrecisionBits, 0, 255));
      }
}

}  // namespace

at::Tensor resize_like_pil(const at::Tensor &image, int64_t height, int64_t width, int resample) {
  if (image.scalar_type() != at::kByte || image.dim() != 3 || image.size(2) < 1 || image.size(2) > 4)
    throw std::runtime_error("resize_like_pil takes an 8-bit image [H, W, C], not " + c10::str(image.sizes()));
  if (resample != 2 && resample != 3) throw std::runtime_error("resize_like_pil: resample must be 2 (bilinear) or 3 (bicubic)");
  if (height < 1 || width < 1 || image.size(0) < 1 || image.size(1) < 1)
    throw std::runtime_error("resize_like_pil: empty image or size");
  at::Tensor cur = image.to(at::kCPU).contiguous();
  const int64_t c = cur.size(2);
  if (width != cur.size(1)) {  // horizontal first, as PIL
    const int64_t h = cur.size(0), w = cur.size(1);
    at::Tensor next = at::empty({h, width, c}, cur.options());
    pass(cur.data_ptr<uint8_t>(), next.data_ptr<uint8_t>(), h, w * c, width * c, c, c, c, taps(w, width, resample), width);
    cur = next;
  }
  if (height != cur.size(0)) {
    const int64_t h = cur.size(0), w = cur.size(1);
    at::Tensor next = at::empty({height, w, c}, cur.options());
    // Each column of each channel is a line: lines start one element apart, neighbours a row apart.
    pass(cur.data_ptr<uint8_t>(), next.data_ptr<uint8_t>(), 1, 0, 0, w * c, w * c, w * c, taps(h, height, resample), height);
    cur = next;
  }
  return cur.is_same(image) ? cur.clone() : cur;
}

ClipImageProcessor ClipImageProcessor::open(const std::string &dir) {
  const std::string path = dir + "/preprocessor_config.json";
  std::string text, err;
  if (!read_small_file(path, kMaxConfigBytes, &text, &err)) throw std::runtime_error(err);
  ClipProcessorConfig c;
  if (!parse_clip_processor_config(text, &c, &err)) throw std::runtime_error("'" + path + "': " + err);
  return ClipImageProcessor(c);
}

std::pair<int64_t, int64_t> ClipImageProcessor::resized_size(int64_t height, int64_t width) const {
  const ClipProcessorConfig &c = config_;
  if (!c.do_resize) return {height, width};
  if (!c.shortest_edge) return {c.resize_height, c.resize_width};
  // transformers' get_resize_output_image_size(default_to_square=False): the long side truncated.
  const int64_t shorter = std::min(height, width), longer = std::max(height, width);
  const auto other = static_cast<int64_t>(static_cast<double>(c.shortest_edge * longer) / static_cast<double>(shorter));
  return width <= height ? std::make_pair(other, c.shortest_edge) : std::make_pair(c.shortest_edge, other);
}

at::Tensor ClipImageProcessor::process(const at::Tensor &rgb) const {
  const ClipProcessorConfig &c = config_;
  if (rgb.scalar_type() != at::kByte || rgb.dim() != 3 || rgb.size(2) != 3)
    throw std::runtime_error("the image processor takes an 8-bit RGB image [H, W, 3], not " +
                             std::string(c10::toString(rgb.scalar_type())) + " " + c10::str(rgb.sizes()));
  if (rgb.size(0) < 1 || rgb.size(1) < 1) throw std::runtime_error("the image processor got an empty image");
  at::Tensor img = rgb.to(at::kCPU);
  const auto [h, w] = resized_size(img.size(0), img.size(1));
  if (h < 1 || w < 1)
    throw std::runtime_error("an image of " + std::to_string(rgb.size(1)) + "x" + std::to_string(rgb.size(0)) +
                             " resizes to nothing (shortest_edge " + std::to_string(c.shortest_edge) + ")");
  if (c.do_resize) img = resize_like_pil(img, h, w, c.resample);
  if (c.do_center_crop) {
    // transformers' center_crop: zero padding (ceil of half the shortfall on top/left) when smaller.
    const int64_t ph = std::max(c.crop_height, h), pw = std::max(c.crop_width, w);
    if (ph != h || pw != w) {
      at::Tensor padded = at::zeros({ph, pw, 3}, img.options());
      const int64_t top = (ph - h + 1) / 2, left = (pw - w + 1) / 2;
      padded.slice(0, top, top + h).slice(1, left, left + w).copy_(img);
      img = padded;
    }
    const int64_t top = (ph - c.crop_height) / 2, left = (pw - c.crop_width) / 2;
    img = img.slice(0, top, top + c.crop_height).slice(1, left, left + c.crop_width);
  }
  // As its NumPy code: x * rescale_factor in float64 stored as float32, then (x - mean) / std in float32.
  at::Tensor x = c.do_rescale ? (img.to(at::kDouble) * c.rescale_factor).to(at::kFloat) : img.to(at::kFloat);
  x = x.permute({2, 0, 1}).contiguous();
  if (c.do_normalize) {
    const auto f = at::TensorOptions().dtype(at::kFloat);
    const auto mean = at::tensor(std::vector<float>(c.image_mean.begin(), c.image_mean.end()), f).view({3, 1, 1});
    const auto sd = at::tensor(std::vector<float>(c.image_std.begin(), c.image_std.end()), f).view({3, 1, 1});
    x = (x - mean) / sd;
  }
  return x;
}

}  // namespace videotrain::models
