#pragma once
// Tensor views (non-owning, any rank ≤ 4, strided) and a small owning host tensor.
// Shapes are row-major logical shapes; strides are in elements.
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "twell/bf16.hpp"
#include "twell/error.hpp"

namespace twell {

enum class DType : std::uint8_t { f32, bf16, i32, u32 };
enum class Device : std::uint8_t { host, cuda };

std::size_t dtype_size(DType dt) noexcept;
const char* to_string(DType dt) noexcept;

inline constexpr int kMaxRank = 4;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device = Device::host;
  int rank = 0;
  std::array<std::int64_t, kMaxRank> shape{};
  std::array<std::int64_t, kMaxRank> strides{};

  std::int64_t numel() const noexcept;
  bool is_contiguous() const noexcept;
  std::string shape_string() const;  // "[M, K]"
};

// A contiguous row-major view of `data` with the given shape.
TensorView make_view(void* data, DType dtype, std::span<const std::int64_t> shape,
                     Device device = Device::host);

// Dense row-major 2-D view: element (r, c) at data[r * ld + c].
template <typename T>
struct Matrix {
  T* data = nullptr;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t ld = 0;

  Matrix() = default;
  Matrix(T* d, std::int64_t r, std::int64_t c) : data(d), rows(r), cols(c), ld(c) {}
  Matrix(T* d, std::int64_t r, std::int64_t c, std::int64_t l) : data(d), rows(r), cols(c), ld(l) {}
  template <typename U>
  Matrix(const Matrix<U>& o) : data(o.data), rows(o.rows), cols(o.cols), ld(o.ld) {}  // T* ← U*

  T* row(std::int64_t r) const noexcept { return data + r * ld; }
  T& operator()(std::int64_t r, std::int64_t c) const noexcept { return data[r * ld + c]; }
};
using MatrixF = Matrix<float>;
using CMatrixF = Matrix<const float>;

// Owning host tensor (row-major, contiguous).
class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(DType dtype, std::vector<std::int64_t> shape);

  DType dtype() const noexcept { return dtype_; }
  const std::vector<std::int64_t>& shape() const noexcept { return shape_; }
  std::int64_t dim(int i) const { return shape_.at(static_cast<std::size_t>(i)); }
  int rank() const noexcept { return static_cast<int>(shape_.size()); }
  std::int64_t numel() const noexcept;
  std::size_t nbytes() const noexcept { return bytes_.size(); }
  std::byte* bytes() noexcept { return bytes_.data(); }
  const std::byte* bytes() const noexcept { return bytes_.data(); }

  template <typename T>
  T* data() {
    return reinterpret_cast<T*>(bytes_.data());
  }
  template <typename T>
  const T* data() const {
    return reinterpret_cast<const T*>(bytes_.data());
  }
  TensorView view();

  // A float32 copy (converting bf16); integer dtypes are rejected.
  HostTensor to_f32() const;
  std::string shape_string() const;

  static HostTensor from_f32(std::vector<std::int64_t> shape, std::span<const float> values);

 private:
  DType dtype_ = DType::f32;
  std::vector<std::int64_t> shape_;
  std::vector<std::byte> bytes_;
};

}  // namespace twell
