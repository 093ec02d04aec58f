#pragma once
// The FFN's gate activations on the host (the CPU runtime's and the activation profile's).
#include <cmath>

#include "twell/model/config.hpp"

namespace twell::model {

inline float activate(Activation a, float g) {
  switch (a) {
    case Activation::relu: return g > 0.0f ? g : 0.0f;
    case Activation::silu: return g / (1.0f + std::exp(-g));
    case Activation::gelu: return 0.5f * g * (1.0f + std::erf(g * 0.70710678118654752f));
    case Activation::gelu_tanh: {
      const float c = 0.7978845608028654f;  // sqrt(2/π)
      return 0.5f * g * (1.0f + std::tanh(c * (g + 0.044715f * g * g * g)));
    }
  }
  return g;
}

}  // namespace twell::model
