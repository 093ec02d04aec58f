// RoPE frequencies per rope type (see twell/model/rope.hpp), in double. transformers computes the
// same formulas in float32; the difference is float32 rounding (≤ 2^-24 relative in inv_freq).
#include "twell/model/rope.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "twell/error.hpp"

namespace twell::model {

const char* to_string(RopeType t) noexcept {
  switch (t) {
    case RopeType::plain: return "default";
    case RopeType::linear: return "linear";
    case RopeType::dynamic: return "dynamic";
    case RopeType::llama3: return "llama3";
    case RopeType::yarn: return "yarn";
  }
  return "?";
}

double yarn_attention_factor(double factor, double mscale, double mscale_all_dim) {
  const auto get = [&](double m) { return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; };
  if (mscale != 0 && mscale_all_dim != 0) return get(mscale) / get(mscale_all_dim);
  return get(1.0);
}

RopeFrequencies rope_frequencies(double theta, const RopeScaling& s, std::int64_t d, std::int64_t max_position,
                                 std::int64_t seq_len) {
  TWELL_CHECK(d >= 2 && d % 2 == 0 && theta > 0, ErrorCode::invalid_argument,
              "rope_frequencies: head_dim {} must be even and positive, theta {} positive", d, theta);
  const std::int64_t half = d / 2;
  const auto dd = static_cast<double>(d);
  double base = theta;
  if (s.type == RopeType::dynamic) {
    // transformers: seq = max(seq_len, max_position); θ · (f·seq/max − (f − 1))^(d/(d−2)).
    TWELL_CHECK(d > 2, ErrorCode::unsupported, "rope_type dynamic needs head_dim > 2, got {}", d);
    const double seq = static_cast<double>(std::max(seq_len, max_position));
    const double mp = static_cast<double>(max_position);
    base = theta * std::pow(s.factor * seq / mp - (s.factor - 1), dd / (dd - 2));
  }
  RopeFrequencies out;
  out.inv_freq.resize(static_cast<std::size_t>(half));
  for (std::int64_t i = 0; i < half; ++i)
    out.inv_freq[static_cast<std::size_t>(i)] = std::pow(base, -2.0 * static_cast<double>(i) / dd);

  switch (s.type) {
    case RopeType::plain:
    case RopeType::dynamic: break;
    case RopeType::linear:
      for (auto& f : out.inv_freq) f /= s.factor;
      break;
    case RopeType::llama3: {
      // Wavelengths above orig/low are divided by factor, below orig/high kept, a linear blend in
      // 1/wavelength between (transformers' _compute_llama3_parameters).
      const auto orig = static_cast<double>(s.original_max_position);
      const double low_wl = orig / s.low_freq_factor, high_wl = orig / s.high_freq_factor;
      for (auto& f : out.inv_freq) {
        const double wl = 2 * std::numbers::pi / f;
        if (wl > low_wl) {
          f /= s.factor;
        } else if (!(wl < high_wl)) {
          const double smooth = (orig / wl - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
          f = (1 - smooth) * f / s.factor + smooth * f;
        }
      }
      break;
    }
    case RopeType::yarn: {
      // Pairs below `low` keep their (extrapolated) frequency, pairs above `high` are interpolated
      // (÷ factor), a linear ramp between (transformers' _compute_yarn_parameters).
      const auto orig = static_cast<double>(s.original_max_position);
      const auto correction_dim = [&](double rotations) {
        return dd * std::log(orig / (rotations * 2 * std::numbers::pi)) / (2 * std::log(theta));
      };
      double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
      if (s.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, dd - 1);
      if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
      for (std::int64_t i = 0; i < half; ++i) {
        auto& f = out.inv_freq[static_cast<std::size_t>(i)];
        const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
        const double extrapolation = 1 - ramp;
        f = (f / s.factor) * (1 - extrapolation) + f * extrapolation;
      }
      out.attention_scaling = s.attention_factor;
      break;
    }
  }
  return out;
}

}  // namespace twell::model
