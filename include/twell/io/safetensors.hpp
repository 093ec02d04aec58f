#pragma once
// safetensors files (https://github.com/huggingface/safetensors), read and written by hand.
//
// Layout: u64 little-endian header length H, then H bytes of JSON, then the data buffer.
//   { "__metadata__": {"key": "value", ...},                      (optional, string → string)
//     "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ... }
// Offsets are relative to the start of the data buffer; end − begin must equal numel · dtype size.
//
// The reader is strict, as the reference implementation is: every tensor's bytes lie inside the
// buffer, no two tensors overlap, the tensors cover the buffer with no gap and nothing trails it,
// names are unique and non-empty. Any violation throws twell::Error(ErrorCode::corrupt) naming the
// file, the tensor and what is wrong; unreadable files throw ErrorCode::io.
//
// Dtypes read: F32, BF16 (kept as bf16; HostTensor::to_f32() converts), I32, U32. F16 is rejected
// by default with a message saying so; ReadOptions::f16_to_f32 converts it exactly to F32 instead.
// Every other dtype of the format (F64, I64, U8, BOOL, F8_*, ...) is rejected as unsupported, and a
// dtype string the format does not define is reported as unknown.
//
// The writer writes F32, BF16, I32 and U32 tensors of any rank (shape [] is a scalar), header
// padded with spaces to a multiple of 8 bytes so the data buffer stays aligned.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "twell/tensor.hpp"

namespace twell::io {

struct NamedTensor {
  std::string name;
  HostTensor tensor;
};

struct SafetensorsFile {
  std::vector<NamedTensor> tensors;  // in data-offset order (the order of the bytes in the file)
  std::map<std::string, std::string> metadata;

  // nullptr when absent.
  const HostTensor* find(const std::string& name) const noexcept;
  bool contains(const std::string& name) const noexcept { return find(name) != nullptr; }
  std::vector<std::string> names() const;
};

struct ReadOptions {
  bool f16_to_f32 = false;  // convert F16 tensors to F32 (exact) instead of rejecting them
};

// Reads and validates a whole file. `path` is used in every message.
SafetensorsFile read_safetensors(const std::string& path, ReadOptions opt = {});

// A file opened for reading one tensor at a time: the header read and validated at open as
// read_safetensors validates it, each tensor's bytes read when asked — into a HostTensor, or
// straight into a caller's buffer (no copy held for the whole file: a checkpoint loader converts
// tensor by tensor).
class SafetensorsReader {
 public:
  struct Info {
    std::string name;
    DType dtype;  // as held in memory (F16 files: f32 with ReadOptions::f16_to_f32)
    std::vector<std::int64_t> shape;
    std::uint64_t bytes = 0;  // in memory
  };
  explicit SafetensorsReader(const std::string& path, ReadOptions opt = {});
  ~SafetensorsReader();
  SafetensorsReader(SafetensorsReader&&) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&&) noexcept;

  const std::string& path() const noexcept;
  const std::map<std::string, std::string>& metadata() const noexcept;
  const std::vector<Info>& tensors() const noexcept;  // in data-offset order
  const Info* find(const std::string& name) const noexcept;  // nullptr when absent
  HostTensor read(const std::string& name);
  // The tensor's bytes as held in memory into dst (exactly find(name)->bytes of them).
  void read_into(const std::string& name, std::span<std::byte> dst);
  // The tensor's bytes in the file, mapped read-only (the whole file is mapped at the first call and
  // stays mapped while any view's owner lives, the reader gone or not): no copy, no fresh pages —
  // a loader hands them on as they are. Empty where the file holds other bytes than memory would
  // (F16 converted) or cannot be mapped; then read_into. The file must not be truncated or
  // rewritten in place while a view is read (writers that replace the file, as twell's do, are safe).
  struct View {
    std::shared_ptr<const void> owner;  // keeps the mapping
    std::span<const std::byte> bytes;
  };
  View view(const std::string& name);
  // The file's identity and state when it was opened (the file the header and every view come from).
  struct FileId {
    std::uint64_t device = 0, inode = 0, size = 0;
    std::int64_t mtime_ns = 0;
  };
  const FileId& file_id() const noexcept;
  // The identity and state of the file at `path` now; nullopt where it cannot be stat'ed.
  static std::optional<FileId> stat_file(const std::string& path);
  // Whether a view of this file is alive beyond the reader (its mapping is still in use).
  bool viewed() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};
// The same from bytes already in memory; `what` names the source in messages.
SafetensorsFile parse_safetensors(std::span<const std::byte> bytes, const std::string& what = "buffer",
                                  ReadOptions opt = {});

struct TensorRef {
  std::string name;
  const HostTensor* tensor;
};

// Serialises tensors (unique, non-empty names not starting with "__") and metadata.
std::vector<std::byte> serialize_safetensors(const std::vector<TensorRef>& tensors,
                                             const std::map<std::string, std::string>& metadata = {});
// Writes atomically: to a temporary file beside `path`, then renamed over it. Throws ErrorCode::io
// naming the path when it cannot be written.
void write_safetensors(const std::string& path, const std::vector<TensorRef>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// A scalar (shape []) f32 tensor.
HostTensor scalar_f32(float value);

}  // namespace twell::io
