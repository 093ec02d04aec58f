#include "twell/tensor.hpp"

#include <cstring>
#include <limits>

namespace twell {

std::size_t dtype_size(DType dt) noexcept {
  switch (dt) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::u32: return 4;
  }
  return 0;
}

const char* to_string(DType dt) noexcept {
  switch (dt) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::u32: return "u32";
  }
  return "?";
}

namespace {
std::string format_shape(const std::int64_t* s, int rank) {
  std::string out = "[";
  for (int i = 0; i < rank; ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}
}  // namespace

std::int64_t TensorView::numel() const noexcept {
  std::int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= shape[static_cast<std::size_t>(i)];
  return n;
}

bool TensorView::is_contiguous() const noexcept {
  std::int64_t expect = 1;
  for (int i = rank - 1; i >= 0; --i) {
    const auto ui = static_cast<std::size_t>(i);
    if (shape[ui] != 1 && strides[ui] != expect) return false;
    expect *= shape[ui];
  }
  return true;
}

std::string TensorView::shape_string() const { return format_shape(shape.data(), rank); }

TensorView make_view(void* data, DType dtype, std::span<const std::int64_t> shape, Device device) {
  TWELL_CHECK(shape.size() <= static_cast<std::size_t>(kMaxRank), ErrorCode::invalid_argument,
              "tensor rank {} exceeds the maximum of {}", shape.size(), kMaxRank);
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.device = device;
  v.rank = static_cast<int>(shape.size());
  std::int64_t stride = 1;
  for (int i = v.rank - 1; i >= 0; --i) {
    const auto ui = static_cast<std::size_t>(i);
    TWELL_CHECK(shape[ui] >= 0, ErrorCode::invalid_argument, "negative tensor dimension {}", shape[ui]);
    v.shape[ui] = shape[ui];
    v.strides[ui] = stride;
    stride *= shape[ui];
  }
  return v;
}

HostTensor::HostTensor(DType dtype, std::vector<std::int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
  std::int64_t n = 1;
  for (auto d : shape_) {
    TWELL_CHECK(d >= 0, ErrorCode::invalid_argument, "negative tensor dimension {}", d);
    TWELL_CHECK(d == 0 || n <= std::numeric_limits<std::int64_t>::max() / 8 / d, ErrorCode::overflow,
                "tensor of shape {} is too large", format_shape(shape_.data(), static_cast<int>(shape_.size())));
    n *= d;
  }
  bytes_.resize(static_cast<std::size_t>(n) * dtype_size(dtype));
}

std::int64_t HostTensor::numel() const noexcept {
  std::int64_t n = 1;
  for (auto d : shape_) n *= d;
  return n;
}

TensorView HostTensor::view() { return make_view(bytes_.data(), dtype_, shape_); }

std::string HostTensor::shape_string() const { return format_shape(shape_.data(), rank()); }

HostTensor HostTensor::to_f32() const {
  HostTensor out(DType::f32, shape_);
  const std::int64_t n = numel();
  switch (dtype_) {
    case DType::f32: std::memcpy(out.bytes(), bytes(), nbytes()); break;
    case DType::bf16: {
      const bf16* in = data<bf16>();
      float* o = out.data<float>();
      for (std::int64_t i = 0; i < n; ++i) o[i] = to_float(in[i]);
      break;
    }
    default: fail(ErrorCode::dtype_mismatch, "cannot convert a {} tensor to f32", to_string(dtype_));
  }
  return out;
}

HostTensor HostTensor::from_f32(std::vector<std::int64_t> shape, std::span<const float> values) {
  HostTensor t(DType::f32, std::move(shape));
  TWELL_CHECK(static_cast<std::size_t>(t.numel()) == values.size(), ErrorCode::shape_mismatch,
              "{} values given for a tensor of shape {}", values.size(), t.shape_string());
  std::memcpy(t.bytes(), values.data(), values.size() * sizeof(float));
  return t;
}

}  // namespace twell
