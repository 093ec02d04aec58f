#pragma once
// How much host memory a request may take, so that work too big for the machine is refused with a
// clear error instead of being killed by the kernel's OOM killer halfway.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace twell {

// The memory the system says can be allocated without swapping (Linux: MemAvailable in
// /proc/meminfo), in bytes; −1 where unknown.
std::int64_t available_host_memory() noexcept;

// Throws ErrorCode::unsupported, naming `what`, the estimate and what is available, when `bytes`
// exceeds 90 % of the available memory (does nothing where that is unknown).
void check_host_memory(double bytes, const std::string& what);

// Appends f(in[0]), …, f(in[n − 1]) to out a block at a time through a buffer on the stack: the
// conversion loop vectorises and the vector's fresh pages are written once (a resized vector is
// zero-filled first; push_back per element does not vectorise). Reserve first: within the capacity
// nothing is allocated (what the loader's guarded reads of a mapped file rely on).
template <class To, class From, class F>
void append_converted(std::vector<To>& out, const From* in, std::size_t n, F f) {
  constexpr std::size_t kBlock = 8192 / sizeof(To);
  To buf[kBlock];
  for (std::size_t b = 0; b < n; b += kBlock) {
    const std::size_t e = std::min(n, b + kBlock);
    for (std::size_t i = b; i < e; ++i) buf[i - b] = f(in[i]);
    out.insert(out.end(), buf, buf + (e - b));
  }
}

}  // namespace twell
