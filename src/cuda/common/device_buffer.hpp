#pragma once
// Owning device allocation, movable, never copied: cudaMalloc/cudaFree, or a caller's
// DeviceAllocator (twell/cuda/device_allocator.hpp) set with use() before the first allocation.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "cuda/common/check.hpp"
#include "twell/cuda/device_allocator.hpp"

namespace twell::cuda {

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t count) { resize(count); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), count_(std::exchange(o.count_, 0)), alloc_(o.alloc_) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      ptr_ = std::exchange(o.ptr_, nullptr);
      count_ = std::exchange(o.count_, 0);
      alloc_ = o.alloc_;
    }
    return *this;
  }

  // Later allocations come from `a` (null: cudaMalloc). What the buffer holds now is freed first.
  // `a` must outlive the buffer.
  void use(DeviceAllocator* a) noexcept {
    release();
    alloc_ = a;
  }

  // Reallocates (contents lost) unless the buffer already holds at least `count` elements.
  void reserve(std::size_t count) {
    if (count > count_) resize(count);
  }
  void resize(std::size_t count) {
    release();
    if (count == 0) return;
    if (!alloc_) {
      TWELL_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr_), count * sizeof(T)));
    } else {
      void* p = alloc_->allocate(count * sizeof(T));
      if (p == nullptr || reinterpret_cast<std::uintptr_t>(p) % 256 != 0) {
        if (p) alloc_->deallocate(p, count * sizeof(T));
        detail::raise(ErrorCode::cuda, "DeviceAllocator::allocate({} bytes) returned {}: twell needs 256-byte aligned memory",
                      count * sizeof(T), p == nullptr ? "null" : "memory not aligned to 256 bytes");
      }
      ptr_ = static_cast<T*>(p);
    }
    count_ = count;
  }
  void release() noexcept {
    if (ptr_) {
      if (alloc_) {
        alloc_->deallocate(ptr_, count_ * sizeof(T));
      } else {
        cudaFree(ptr_);
      }
    }
    ptr_ = nullptr;
    count_ = 0;
  }
  T* get() const noexcept { return ptr_; }
  std::size_t size() const noexcept { return count_; }
  std::size_t bytes() const noexcept { return count_ * sizeof(T); }

 private:
  T* ptr_ = nullptr;
  std::size_t count_ = 0;
  DeviceAllocator* alloc_ = nullptr;
};

// Owning pinned host allocation (for small asynchronous read-backs such as counters).
template <typename T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::size_t count) {
    TWELL_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&ptr_), count * sizeof(T)));
    count_ = count;
  }
  ~PinnedBuffer() {
    if (ptr_) cudaFreeHost(ptr_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  PinnedBuffer(PinnedBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    if (this != &o) {
      if (ptr_) cudaFreeHost(ptr_);
      ptr_ = std::exchange(o.ptr_, nullptr);
      count_ = std::exchange(o.count_, 0);
    }
    return *this;
  }
  T* get() const noexcept { return ptr_; }
  T& operator[](std::size_t i) const noexcept { return ptr_[i]; }

 private:
  T* ptr_ = nullptr;
  std::size_t count_ = 0;
};

}  // namespace twell::cuda
