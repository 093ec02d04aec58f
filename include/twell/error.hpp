#pragma once
// One error type for the whole library. Library code throws twell::Error; only tools and tests
// print and exit. Messages say what was wrong and what to do about it.
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace twell {

enum class ErrorCode {
  invalid_argument,  // an option or parameter out of range
  shape_mismatch,    // tensor shapes that do not fit together
  dtype_mismatch,    // a tensor of a dtype the op does not take
  io,                // a file that cannot be opened, read or written
  corrupt,           // a file or buffer whose contents are malformed
  non_finite,        // NaN or Inf in an input
  overflow,          // a value or index that does not fit its storage
  unsupported,       // a valid request this build or device cannot serve
  cuda,              // a CUDA runtime or library call failed
  internal,          // a broken invariant: a bug in twell
};

const char* to_string(ErrorCode code) noexcept;

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

template <typename... Args>
[[noreturn]] void fail(ErrorCode code, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(code, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace twell

// Throws twell::Error(code, message) unless cond holds.
#define TWELL_CHECK(cond, code, ...)                   \
  do {                                                 \
    if (!(cond)) ::twell::fail(code, __VA_ARGS__);     \
  } while (0)
