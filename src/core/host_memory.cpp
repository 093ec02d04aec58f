#include "twell/host_memory.hpp"

#include <fstream>
#include <sstream>

#include "twell/error.hpp"

namespace twell {

std::int64_t available_host_memory() noexcept {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream s(line);
    std::string key;
    std::int64_t kb = 0;
    if (s >> key >> kb && key == "MemAvailable:") return kb * 1024;
  }
  return -1;
}

void check_host_memory(double bytes, const std::string& what) {
  const std::int64_t avail = available_host_memory();
  if (avail < 0 || bytes <= 0.9 * static_cast<double>(avail)) return;
  fail(ErrorCode::unsupported, "{} needs about {:.1f} GB of host memory; this machine has {:.1f} GB available", what,
       bytes / 1e9, static_cast<double>(avail) / 1e9);
}

}  // namespace twell
