#include "twell/error.hpp"

namespace twell {

const char* to_string(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::invalid_argument: return "invalid argument";
    case ErrorCode::shape_mismatch: return "shape mismatch";
    case ErrorCode::dtype_mismatch: return "dtype mismatch";
    case ErrorCode::io: return "I/O error";
    case ErrorCode::corrupt: return "corrupt data";
    case ErrorCode::non_finite: return "non-finite value";
    case ErrorCode::overflow: return "overflow";
    case ErrorCode::unsupported: return "unsupported";
    case ErrorCode::cuda: return "CUDA error";
    case ErrorCode::internal: return "internal error";
  }
  return "unknown error";
}

}  // namespace twell
