// Precompiled header for the translation units that use LibTorch.
#include <torch/torch.h>
#include <torch/script.h>
