#pragma once
// How much host memory a request may take, so that work too big for the machine is refused with a
// clear error instead of being killed by the kernel's OOM killer halfway.
#include <cstdint>
#include <string>

namespace twell {

// The memory the system says can be allocated without swapping (Linux: MemAvailable in
// /proc/meminfo), in bytes; −1 where unknown.
std::int64_t available_host_memory() noexcept;

// Throws ErrorCode::unsupported, naming `what`, the estimate and what is available, when `bytes`
// exceeds 90 % of the available memory (does nothing where that is unknown).
void check_host_memory(double bytes, const std::string& what);

}  // namespace twell
