// safetensors reader/writer: round trips and every kind of malformed file.
#include <gtest/gtest.h>

#include <cstring>
#include <span>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "twell/io/safetensors.hpp"

namespace {

using namespace twell;
using twell::io::parse_safetensors;
using twell::io::serialize_safetensors;

std::vector<std::byte> raw_file(const std::string& header, std::size_t data_bytes, std::uint64_t header_len_override = 0) {
  std::vector<std::byte> out(8 + header.size() + data_bytes);
  const std::uint64_t n = header_len_override ? header_len_override : header.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, header.data(), header.size());
  for (std::size_t i = 0; i < data_bytes; ++i) out[8 + header.size() + i] = std::byte(i & 0xff);
  return out;
}

// Expects parse to throw twell::Error with `code` and a message containing `phrase`.
void expect_error(const std::vector<std::byte>& bytes, ErrorCode code, const std::string& phrase,
                  io::ReadOptions opt = {}) {
  try {
    parse_safetensors(bytes, "test.safetensors", opt);
    FAIL() << "no error; expected one containing '" << phrase << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(phrase), std::string::npos) << "message: " << e.what();
    EXPECT_NE(std::string(e.what()).find("test.safetensors"), std::string::npos) << "message names no file: " << e.what();
  }
}

HostTensor iota_f32(std::vector<std::int64_t> shape, float start = 0.5f) {
  HostTensor t(DType::f32, std::move(shape));
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = start + static_cast<float>(i) * 0.25f;
  return t;
}

void expect_same(const HostTensor& a, const HostTensor& b) {
  EXPECT_EQ(a.dtype(), b.dtype());
  EXPECT_EQ(a.shape(), b.shape());
  ASSERT_EQ(a.nbytes(), b.nbytes());
  EXPECT_EQ(0, std::memcmp(a.bytes(), b.bytes(), a.nbytes()));
}

TEST(Safetensors, RoundTripF32Bf16ScalarsAndEdges) {
  const HostTensor a = iota_f32({3, 5});
  HostTensor b(DType::bf16, {7});
  for (int i = 0; i < 7; ++i) b.data<bf16>()[i] = to_bf16(-1.5f * static_cast<float>(i));
  const HostTensor s = io::scalar_f32(2.5e-5f);
  const HostTensor one = iota_f32({1});
  const HostTensor empty(DType::f32, {0, 4});  // zero-size dimension: no bytes, offsets [p, p]
  const HostTensor r3 = iota_f32({2, 3, 4});
  HostTensor ints(DType::i32, {4});
  for (int i = 0; i < 4; ++i) ints.data<std::int32_t>()[i] = -i * 1000;
  const std::vector<io::TensorRef> refs{{"a", &a}, {"b", &b},   {"s", &s},       {"one", &one},
                                        {"empty", &empty}, {"r3", &r3}, {"ints", &ints}};
  const auto bytes = serialize_safetensors(refs, {{"format", "pt"}, {"note", "héllo"}});
  // Header length is a multiple of 8 so the data buffer is aligned.
  std::uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);

  const io::SafetensorsFile f = parse_safetensors(bytes);
  ASSERT_EQ(f.tensors.size(), refs.size());
  for (const auto& r : refs) {
    const HostTensor* t = f.find(r.name);
    ASSERT_NE(t, nullptr) << r.name;
    expect_same(*t, *r.tensor);
  }
  EXPECT_EQ(f.find("s")->rank(), 0);
  EXPECT_EQ(f.metadata.at("format"), "pt");
  EXPECT_EQ(f.metadata.at("note"), "héllo");
  EXPECT_EQ(f.find("nope"), nullptr);
}

TEST(Safetensors, FileRoundTripAndIoErrors) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("twell_st_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "t.safetensors").string();
  const HostTensor a = iota_f32({4, 2});
  const HostTensor empty_file_tensor(DType::f32, {0});
  io::write_safetensors(path, {{"a", &a}, {"z", &empty_file_tensor}});
  const io::SafetensorsFile f = io::read_safetensors(path);
  expect_same(*f.find("a"), a);
  EXPECT_EQ(f.find("z")->numel(), 0);
  // No temporary files left behind.
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++entries;
  EXPECT_EQ(entries, 1);

  // Truncated on disk: the last byte cut.
  fs::resize_file(path, fs::file_size(path) - 1);
  EXPECT_THROW(io::read_safetensors(path), Error);
  try {
    io::read_safetensors(path);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::corrupt);
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }

  try {
    io::read_safetensors((dir / "missing.safetensors").string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::io);
    EXPECT_NE(std::string(e.what()).find("missing.safetensors"), std::string::npos);
  }
  EXPECT_THROW(io::read_safetensors(dir.string()), Error);  // a directory
  try {
    io::write_safetensors((dir / "no" / "such" / "dir.safetensors").string(), {{"a", &a}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::io);
  }
  fs::remove_all(dir);
}

// The reader: tensors read in any order, into a HostTensor or a caller's buffer of the exact size
// (F16 converted when asked), the same bits read_safetensors gives; an unknown name or a buffer of
// another size is an error naming it.
TEST(Safetensors, ReaderReadsTensorsOneAtATime) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("twell_st_reader_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "r.safetensors").string();
  const HostTensor a = iota_f32({4, 2}), b = iota_f32({3}), empty(DType::f32, {0});
  io::write_safetensors(path, {{"a", &a}, {"b", &b}, {"e", &empty}}, {{"format", "pt"}});
  io::SafetensorsReader r(path);
  EXPECT_EQ(r.path(), path);
  EXPECT_EQ(r.metadata().at("format"), "pt");
  ASSERT_EQ(r.tensors().size(), 3u);
  ASSERT_NE(r.find("b"), nullptr);
  EXPECT_EQ(r.find("b")->bytes, 3 * sizeof(float));
  EXPECT_EQ(r.find("nope"), nullptr);
  expect_same(r.read("b"), b);  // out of file order
  expect_same(r.read("a"), a);
  std::vector<float> into(8);
  r.read_into("a", std::as_writable_bytes(std::span(into)));
  EXPECT_EQ(std::memcmp(into.data(), a.bytes(), a.nbytes()), 0);
  EXPECT_EQ(r.read("e").numel(), 0);
  std::vector<float> small(7);
  EXPECT_THROW(r.read_into("a", std::as_writable_bytes(std::span(small))), Error);
  try {
    (void)r.read("nope");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nope"), std::string::npos) << e.what();
  }
  // F16 on disk, converted to f32 as it is read (1.0, -2.0, 65504).
  const std::uint16_t h[] = {0x3c00, 0xc000, 0x7bff};
  const std::string header = R"({"h":{"dtype":"F16","shape":[3],"data_offsets":[0,6]}})";
  auto bytes = raw_file(header, 6);
  std::memcpy(bytes.data() + 8 + header.size(), h, 6);
  const std::string f16 = (dir / "h.safetensors").string();
  std::ofstream(f16, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  io::ReadOptions opt;
  opt.f16_to_f32 = true;
  io::SafetensorsReader rh(f16, opt);
  EXPECT_EQ(rh.find("h")->dtype, DType::f32);
  EXPECT_EQ(rh.find("h")->bytes, 3 * sizeof(float));
  std::vector<float> hv(3);
  rh.read_into("h", std::as_writable_bytes(std::span(hv)));
  EXPECT_EQ(hv, (std::vector<float>{1.0f, -2.0f, 65504.0f}));
  EXPECT_TRUE(rh.view("h").bytes.empty());  // converted as read: no view of the file's bytes
  fs::remove_all(dir);
}

// A view is the tensor's bytes in the mapped file: equal to what read_into gives, outliving the
// reader and the file's name; an empty tensor has none; an unknown name is an error.
TEST(Safetensors, ReaderViewsTensorsInTheMappedFile) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("twell_st_view_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "v.safetensors").string();
  const HostTensor a = iota_f32({4, 2}), b = iota_f32({3}), empty(DType::f32, {0});
  io::write_safetensors(path, {{"a", &a}, {"b", &b}, {"e", &empty}});
  io::SafetensorsReader::View va, vb;
  {
    io::SafetensorsReader r(path);
    va = r.view("a");
    vb = r.view("b");
    EXPECT_TRUE(r.view("e").bytes.empty());
    EXPECT_THROW((void)r.view("nope"), Error);
  }
  fs::remove_all(dir);
  ASSERT_EQ(va.bytes.size(), a.nbytes());
  ASSERT_EQ(vb.bytes.size(), b.nbytes());
  EXPECT_EQ(std::memcmp(va.bytes.data(), a.bytes(), a.nbytes()), 0);
  EXPECT_EQ(std::memcmp(vb.bytes.data(), b.bytes(), b.nbytes()), 0);
  EXPECT_EQ(va.owner, vb.owner);  // one mapping for the file
}

// Views come from the file the header was read from: one replaced under the name afterwards (a
// new file renamed over it) does not leak in; one changed in place is refused, not mapped.
TEST(Safetensors, ReaderViewsTheFileItOpened) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("twell_st_view_file_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "v.safetensors").string();
  const HostTensor a = iota_f32({4, 2});
  HostTensor other = iota_f32({4, 2});
  for (std::int64_t i = 0; i < other.numel(); ++i) other.data<float>()[i] += 100.0f;
  io::write_safetensors(path, {{"a", &a}});
  {
    io::SafetensorsReader r(path);
    EXPECT_FALSE(r.viewed());
    io::write_safetensors(path, {{"a", &other}});  // a temporary file renamed over the name
    const io::SafetensorsReader::View v = r.view("a");
    ASSERT_EQ(v.bytes.size(), a.nbytes());
    EXPECT_EQ(std::memcmp(v.bytes.data(), a.bytes(), a.nbytes()), 0);
    EXPECT_TRUE(r.viewed());
  }
  {
    io::SafetensorsReader r(path);
    std::ofstream(path, std::ios::binary | std::ios::app) << ' ';  // the same file, one byte longer
    try {
      (void)r.view("a");
      ADD_FAILURE() << "a file changed in place was mapped";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("changed in place"), std::string::npos) << e.what();
    }
  }
  fs::remove_all(dir);
}

TEST(Safetensors, F16RejectedOrConverted) {
  // 1.0, -2.0, 65504 (max), 2^-24 (smallest subnormal), +Inf in binary16.
  const std::uint16_t h[] = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x7c00};
  std::string header = R"({"h":{"dtype":"F16","shape":[5],"data_offsets":[0,10]}})";
  auto bytes = raw_file(header, 10);
  std::memcpy(bytes.data() + 8 + header.size(), h, 10);
  expect_error(bytes, ErrorCode::dtype_mismatch, "F16");
  io::ReadOptions opt;
  opt.f16_to_f32 = true;
  const auto f = parse_safetensors(bytes, "x", opt);
  const float* v = f.find("h")->data<float>();
  EXPECT_EQ(f.find("h")->dtype(), DType::f32);
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], -2.0f);
  EXPECT_EQ(v[2], 65504.0f);
  EXPECT_EQ(v[3], std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(v[4]));
}

TEST(Safetensors, CorruptFiles) {
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ASSERT_NO_THROW(parse_safetensors(raw_file(ok, 8)));

  // Shorter than the 8-byte length prefix, and empty.
  expect_error(std::vector<std::byte>(5), ErrorCode::corrupt, "truncated");
  expect_error({}, ErrorCode::corrupt, "truncated");
  // Header length past the end of the file.
  expect_error(raw_file(ok, 8, 1000), ErrorCode::corrupt, "runs past the end");
  expect_error(raw_file(ok, 8, ~0ull), ErrorCode::corrupt, "runs past the end");
  // Data shorter than the offsets say (a truncated file).
  expect_error(raw_file(ok, 4), ErrorCode::corrupt, "truncated");
  // Trailing bytes after the last tensor.
  expect_error(raw_file(ok, 12), ErrorCode::corrupt, "after the last tensor");
  // Not JSON / not an object.
  expect_error(raw_file(R"({"a":{"dtype":"F32",)", 0), ErrorCode::corrupt, "not valid JSON");
  expect_error(raw_file("\x01\x02garbage", 0), ErrorCode::corrupt, "not valid JSON");
  expect_error(raw_file("[1, 2]", 0), ErrorCode::corrupt, "JSON object");
  // Offsets out of range, reversed, overlapping, leaving a gap, or not matching shape × dtype.
  expect_error(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 8), ErrorCode::corrupt,
               "run past the end");
  expect_error(raw_file(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8), ErrorCode::corrupt,
               "end before");
  expect_error(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
               ErrorCode::corrupt, "overlap");
  expect_error(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8),
               ErrorCode::corrupt, "overlap");
  expect_error(raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8), ErrorCode::corrupt,
               "unused bytes");
  expect_error(raw_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), ErrorCode::corrupt,
               "needs 12");
  expect_error(raw_file(R"({"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,8]}})", 8), ErrorCode::corrupt,
               "needs 4");
  // Shape × dtype that overflows 64 bits must not wrap around to a small number.
  expect_error(raw_file(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
               ErrorCode::corrupt, "more than 2^64");
  expect_error(raw_file(R"({"a":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,8]}})", 8),
               ErrorCode::corrupt, "needs");
  // Dtypes: unknown, and known to the format but not read by twell.
  expect_error(raw_file(R"({"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", 8), ErrorCode::corrupt,
               "unknown dtype");
  expect_error(raw_file(R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8), ErrorCode::dtype_mismatch,
               "F64");
  // Duplicate names (nlohmann would keep the last silently), also inside an entry.
  expect_error(raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                        R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
               ErrorCode::corrupt, "duplicate name 'a'");
  expect_error(raw_file(R"({"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8),
               ErrorCode::corrupt, "duplicate");
  // Malformed entries.
  expect_error(raw_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), ErrorCode::corrupt,
               "negative");
  expect_error(raw_file(R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", 8), ErrorCode::corrupt,
               "integers");
  expect_error(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8), ErrorCode::corrupt,
               "data_offsets");
  expect_error(raw_file(R"({"a":{"dtype":"F32","shape":[2]}})", 8), ErrorCode::corrupt, "no 'data_offsets'");
  expect_error(raw_file(R"({"a":{"dtype":32,"shape":[2],"data_offsets":[0,8]}})", 8), ErrorCode::corrupt,
               "dtype must be a string");
  expect_error(raw_file(R"({"a":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", 8), ErrorCode::corrupt,
               "shape must be an array");
  expect_error(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8), ErrorCode::corrupt,
               "unexpected field");
  expect_error(raw_file(R"({"a":[1,2]})", 0), ErrorCode::corrupt, "must be an object");
  expect_error(raw_file(R"({"":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8), ErrorCode::corrupt,
               "empty name");
  expect_error(raw_file(R"({"__metadata__":{"k":1},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8),
               ErrorCode::corrupt, "__metadata__");
  expect_error(raw_file(R"({"__metadata__":[],"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8),
               ErrorCode::corrupt, "__metadata__");
  // Valid: metadata, header padded with spaces, no tensors at all.
  EXPECT_NO_THROW(parse_safetensors(
      raw_file(R"({"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}    )", 8)));
  EXPECT_NO_THROW(parse_safetensors(raw_file("{}", 0)));
  EXPECT_THROW(parse_safetensors(raw_file("{}", 3)), Error);
}

TEST(Safetensors, WriterRejectsBadNames) {
  const HostTensor a = iota_f32({2});
  EXPECT_THROW(serialize_safetensors({{"a", &a}, {"a", &a}}), Error);
  EXPECT_THROW(serialize_safetensors({{"", &a}}), Error);
  EXPECT_THROW(serialize_safetensors({{"__metadata__", &a}}), Error);
}

TEST(Safetensors, HeaderIsStandardJson) {
  // What other readers see: a plain JSON object with the documented fields.
  const HostTensor a = iota_f32({2, 3});
  const auto bytes = serialize_safetensors({{"w", &a}});
  std::uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  const auto j = nlohmann::json::parse(std::string(reinterpret_cast<const char*>(bytes.data()) + 8, n));
  EXPECT_EQ(j["w"]["dtype"], "F32");
  EXPECT_EQ(j["w"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(j["w"]["data_offsets"], nlohmann::json({0, 24}));
  EXPECT_EQ(bytes.size(), 8 + n + 24);
}

}  // namespace
