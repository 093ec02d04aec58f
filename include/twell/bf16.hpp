#pragma once
// bfloat16 storage type with round-to-nearest-even conversion from float.
// Host-only; CUDA code uses __nv_bfloat16, which has the same bit layout.
#include <bit>
#include <cstdint>

namespace twell {

struct bf16 {
  std::uint16_t bits = 0;
};

// Round-to-nearest-even; NaN stays NaN (quiet), ±Inf stays ±Inf, overflow rounds to ±Inf.
constexpr bf16 to_bf16(float f) noexcept {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
    return bf16{static_cast<std::uint16_t>((u >> 16) | 0x0040u)};
  }
  std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<std::uint16_t>((u + rounding) >> 16)};
}

constexpr float to_float(bf16 b) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b.bits) << 16);
}

// The float nearest to f that a bf16 can hold (what storing f as bf16 and reading it back gives).
constexpr float round_bf16(float f) noexcept { return to_float(to_bf16(f)); }

}  // namespace twell
