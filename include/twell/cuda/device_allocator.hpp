#pragma once
// Device memory from the caller, so that a framework's allocator (PyTorch's caching allocator, say)
// can own the workspaces twell's layers share instead of twell and the framework each holding a pool.
#include <cstddef>

namespace twell::cuda {

// twell calls allocate / deallocate from inside its own calls, on the calling thread, with the
// call's device current, when a workspace buffer grows (deallocate the old block, then allocate the
// new one) or when the workspace goes. Contract:
//  - allocate(bytes) returns device memory of the current device, at least `bytes` long and aligned
//    to 256 bytes (cudaMalloc's alignment, which the kernels' vector loads rely on), or throws;
//    twell then fails the call with that exception and keeps nothing half-grown.
//  - Memory given back may still be read by work queued earlier on the stream of the call: the
//    allocator must hand it out again only in that stream's order (a stream-ordered allocator used on
//    the call's stream does this, as do cudaMalloc / cudaFree).
//  - deallocate(p, bytes) takes back exactly what allocate returned, with the same `bytes`; it must
//    not throw.
class DeviceAllocator {
 public:
  virtual ~DeviceAllocator() = default;
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* p, std::size_t bytes) noexcept = 0;
};

}  // namespace twell::cuda
