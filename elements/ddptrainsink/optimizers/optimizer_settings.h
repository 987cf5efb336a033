/* ddptrainsink's optimizer=... and its hyper-parameters, without torch (the element's
 * properties fill it; make_optimizer() in train_optimizer.h builds the optimizer). */
#pragma once

#include <string>

namespace videotrain {

// The hyper-parameters only some optimizers use. A negative beta3, eps2 (and eps in
// OptimizerSettings) stands for the optimizer's own default (resolve_optimizer_settings()).
struct OptimizerExtras {
  double beta3 = -1;              // prodigy: sqrt(beta2); came: 0.9999
  double eps2 = -1;               // adafactor: 1e-3 (parameter-scale floor); came: 1e-16 (instability)
  double momentum = 0;            // sgd
  bool nesterov = false;          // sgd
  double clip_threshold = 1.0;    // adafactor, came: update RMS clipping
  double beta2_decay = -0.8;      // adafactor: 1 - beta2_t = t^beta2_decay
  double d0 = 1e-6, d_coef = 1.0; // prodigy: initial step-size estimate, its multiplier
  bool safeguard_warmup = false, use_bias_correction = false;  // prodigy
};

struct OptimizerSettings {
  std::string kind = "adamw";  // adamw | adamw8bit | adafactor | prodigy | came | sgd
  double lr = 1e-4, weight_decay = 0.01, beta1 = 0.9, beta2 = 0.999;
  double eps = -1;  // adamw, adamw8bit, prodigy: 1e-8; adafactor: float32 epsilon; came: 1e-30
  OptimizerExtras x;
};

// "adamw, adamw8bit, adafactor, prodigy, came, sgd" (errors).
const char *optimizer_kinds();

// Replaces the negative defaults by `s->kind`'s own; "" or what is wrong, naming the property.
std::string resolve_optimizer_settings(OptimizerSettings *s);

}  // namespace videotrain
