// model::StagedUpload (src/model/staged_upload.hpp): every byte arrives, for sizes around and across
// the staging chunk, unaligned sources and destinations, copies queued back to back; a source may
// be overwritten as soon as copy() returns; a source whose mapped file was truncated is an io Error.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "cuda/common/check.hpp"
#include "cuda/common/device_buffer.hpp"
#include "cuda_test_util.hpp"
#include "model/staged_upload.hpp"
#include "twell/error.hpp"

namespace {

using twell::Error;
using twell::ErrorCode;
using twell::cuda::DeviceBuffer;
using twell::model::StagedUpload;

TEST(StagedUpload, EveryByteArrivesAtEverySize) {
  TWELL_REQUIRE_GPU();
  // A 3 MiB + 5 chunk: several chunks a copy, and thread teams of 1–3 per chunk.
  const std::size_t chunk = (std::size_t{3} << 20) + 5;
  const std::size_t sizes[] = {0, 1, 7, 4095, chunk - 1, chunk, chunk + 1, 2 * chunk + 3, 5 * chunk + 17};
  std::size_t total = 0;
  for (std::size_t n : sizes) total += n + 3;
  std::mt19937_64 rng(20261127);
  std::vector<unsigned char> src(total + 16);
  for (auto& b : src) b = static_cast<unsigned char>(rng());
  DeviceBuffer<unsigned char> dev(total + 16);
  TWELL_CUDA_CHECK(cudaMemset(dev.get(), 0, total + 16));
  cudaStream_t s = nullptr;
  TWELL_CUDA_CHECK(cudaStreamCreate(&s));
  {
    StagedUpload up(s, chunk);
    std::size_t at = 1;  // odd offsets on both sides
    for (std::size_t n : sizes) {
      up.copy(dev.get() + at, src.data() + at + 2, n, "test");
      at += n + 3;
    }
    up.finish();
  }
  std::vector<unsigned char> back(total + 16);
  TWELL_CUDA_CHECK(cudaMemcpy(back.data(), dev.get(), back.size(), cudaMemcpyDeviceToHost));
  std::size_t at = 1;
  for (std::size_t n : sizes) {
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_EQ(back[at + i], src[at + 2 + i]) << "copy of " << n << " bytes, byte " << i;
    for (std::size_t i = n; i < n + 3 && at + i < back.size(); ++i)
      ASSERT_EQ(back[at + i], 0) << "written past the copy of " << n << " bytes";
    at += n + 3;
  }
  TWELL_CUDA_CHECK(cudaStreamDestroy(s));
}

TEST(StagedUpload, TheSourceIsReadWhenCopyReturns) {
  TWELL_REQUIRE_GPU();
  const std::size_t chunk = std::size_t{1} << 20, n = 3 * chunk + 11;
  std::vector<unsigned char> host(n);
  DeviceBuffer<unsigned char> a(n), b(n);
  {
    StagedUpload up(nullptr, chunk);
    std::fill(host.begin(), host.end(), 0x5a);
    up.copy(a.get(), host.data(), n, "test");
    std::fill(host.begin(), host.end(), 0xc3);  // before the first copy is known to have landed
    up.copy(b.get(), host.data(), n, "test");
  }  // the destructor waits too
  std::vector<unsigned char> ha(n), hb(n);
  TWELL_CUDA_CHECK(cudaMemcpy(ha.data(), a.get(), n, cudaMemcpyDeviceToHost));
  TWELL_CUDA_CHECK(cudaMemcpy(hb.data(), b.get(), n, cudaMemcpyDeviceToHost));
  EXPECT_EQ(ha, std::vector<unsigned char>(n, 0x5a));
  EXPECT_EQ(hb, std::vector<unsigned char>(n, 0xc3));
}

TEST(StagedUpload, ATruncatedMappedSourceIsAnIoError) {
  TWELL_REQUIRE_GPU();
  namespace fs = std::filesystem;
  const std::string path = (fs::temp_directory_path() / ("twell_staged_" + std::to_string(::getpid()))).string();
  const std::size_t n = std::size_t{8} << 20;  // two 4 MiB chunks, each copied by a team of threads
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(n)), 0);
  void* p = ::mmap(nullptr, n, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(p, MAP_FAILED);
  ASSERT_EQ(::ftruncate(fd, 4096), 0);
  DeviceBuffer<unsigned char> d(n);
  StagedUpload up(nullptr, std::size_t{4} << 20);
  try {
    up.copy(d.get(), p, n, path);
    ADD_FAILURE() << "a read past the truncated file's end did not fail";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::io) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  up.copy(d.get(), p, 4096, path);  // what is left of the file still copies
  up.finish();
  ::munmap(p, n);
  ::close(fd);
  fs::remove(path);
}

}  // namespace
