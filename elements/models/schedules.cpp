#include "schedules.h"

#include <cmath>
#include <stdexcept>

namespace videotrain::models {
namespace {

constexpr int kTrainSteps = 1000;

float shift_f(float sigma, float shift) { return shift * sigma / (1.0f + (shift - 1.0f) * sigma); }
double shift_d(double sigma, double shift) { return shift * sigma / (1.0 + (shift - 1.0) * sigma); }

// numpy.linspace(a, b, n) as float64.
std::vector<double> linspace(double a, double b, int n) {
  std::vector<double> v(n);
  if (n == 1) {
    v[0] = a;
    return v;
  }
  const double step = (b - a) / (n - 1);
  for (int i = 0; i < n; ++i) v[i] = a + i * step;
  v[n - 1] = b;
  return v;
}

// torch.linspace's float64 kernel: the second half counts back from the end.
std::vector<double> torch_linspace(double a, double b, int n) {
  std::vector<double> v(n);
  const double step = (b - a) / (n - 1);
  for (int i = 0; i < n; ++i) v[i] = i < n / 2 ? a + step * i : b - step * (n - i - 1);
  return v;
}

void check_steps(int steps) {
  if (steps < 1 || steps > kTrainSteps) throw std::invalid_argument("steps must be in 1..1000");
}

}  // namespace

StepSchedule flowmatch_schedule(int steps, double shift) {
  check_steps(steps);
  // The scheduler's own training table is float32; sigma_min is its last entry (t = 1).
  const float sigma_min = shift_f(1.0f / kTrainSteps, static_cast<float>(shift));
  const float sigma_max = shift_f(1.0f, static_cast<float>(shift));
  StepSchedule s;
  for (double t : linspace(sigma_max * double(kTrainSteps), sigma_min * double(kTrainSteps), steps)) {
    const float sigma = static_cast<float>(shift_d(t / kTrainSteps, shift));
    s.sigmas.push_back(sigma);
    s.timesteps.push_back(static_cast<float>(sigma * float(kTrainSteps)));
  }
  s.sigmas.push_back(0.0);
  return s;
}

StepSchedule unipc_flow_schedule(int steps, double shift) {
  check_steps(steps);
  auto a = linspace(1.0, 1.0 / kTrainSteps, steps + 1);
  a.pop_back();
  StepSchedule s;
  s.integer_timesteps = true;
  for (double x : a) {
    double sigma = shift_d(x, shift);
    if (sigma >= 1.0) sigma -= 1e-6;  // keeps log(alpha) finite at the first step
    s.sigmas.push_back(static_cast<float>(sigma));
    s.timesteps.push_back(std::trunc(sigma * kTrainSteps));
  }
  s.sigmas.push_back(0.0);
  return s;
}

StepSchedule trailing_schedule(int steps) {
  check_steps(steps);
  StepSchedule s;
  s.integer_timesteps = true;
  const double ratio = double(kTrainSteps) / steps;
  for (int i = 0; i < steps; ++i) s.timesteps.push_back(std::round(kTrainSteps - i * ratio) - 1.0);
  return s;
}

std::vector<double> cogvideox_alphas_cumprod(double snr_shift_scale) {
  if (!(snr_shift_scale > 0.0)) throw std::invalid_argument("snr_shift_scale must be > 0");
  const auto root = torch_linspace(std::sqrt(0.00085), std::sqrt(0.012), kTrainSteps);
  std::vector<double> a(kTrainSteps);
  double prod = 1.0;
  for (int i = 0; i < kTrainSteps; ++i) {
    prod *= 1.0 - root[i] * root[i];
    a[i] = prod / (snr_shift_scale + (1.0 - snr_shift_scale) * prod);
  }
  const double first = std::sqrt(a.front()), last = std::sqrt(a.back());
  for (double &x : a) {
    const double r = (std::sqrt(x) - last) * (first / (first - last));
    x = r * r;
  }
  return a;
}

}  // namespace videotrain::models
