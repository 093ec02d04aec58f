#pragma once
// A test-only kernel that writes late: launched like the library's kernels (programmatically inside a
// cuda::ProgrammaticLaunch scope), it waits for the kernel before it, lets the next one start, then
// spins for about `spin_us` microseconds before copying `bytes` from src to dst. A kernel launched
// right after it that reads dst before its own wait sees the old bytes every time: what turns a
// "must read after the wait" rule from a race that rarely shows into a deterministic test.
#include <cuda_runtime.h>

#include <cstddef>

namespace twell::test {

void late_copy(const void* src, void* dst, std::size_t bytes, unsigned spin_us, cudaStream_t stream);

}  // namespace twell::test
