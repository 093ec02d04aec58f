// CountRing: asynchronous read-back of device counts, polled without waiting.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "cuda/common/count_ring.hpp"
#include "cuda/common/device_buffer.hpp"
#include "cuda_test_util.hpp"

namespace twell::cuda::test {
namespace {

void set(DeviceBuffer<unsigned long long>& d, unsigned long long v, cudaStream_t s) {
  ASSERT_EQ(cudaMemcpyAsync(d.get(), &v, sizeof v, cudaMemcpyHostToDevice, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
}

TEST(CountRing, ReturnsTheNewestCompletedCountOnce) {
  TWELL_REQUIRE_GPU();
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  DeviceBuffer<unsigned long long> d(1);
  CountRing ring(3);
  double v = -1;
  EXPECT_FALSE(ring.poll(&v));  // nothing pushed

  set(d, 30, s);
  ring.push(d.get(), 10.0, s);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  ASSERT_TRUE(ring.poll(&v));
  EXPECT_EQ(v, 3.0);
  EXPECT_FALSE(ring.poll(&v));  // already returned

  // More pushes than slots while the stream is held up (a host function sleeps on it): the ring
  // must wait for its oldest slot, and the newest value wins.
  DeviceBuffer<unsigned long long> seven(7);
  const unsigned long long vals[7] = {1, 2, 3, 4, 5, 6, 7};
  ASSERT_EQ(::twell::cuda::test::h2d(seven.get(), vals, sizeof vals), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // s (non-blocking) does not wait for the copy's DMA
  ASSERT_EQ(cudaLaunchHostFunc(
                s, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(50)); }, nullptr),
            cudaSuccess);
  for (int i = 0; i < 7; ++i) ring.push(seven.get() + i, 1.0, s);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  ASSERT_TRUE(ring.poll(&v));
  EXPECT_EQ(v, 7.0);

  // After a reset the next push is returned (the reset forgets older ones only).
  set(d, 40, s);
  ring.push(d.get(), 1.0, s);
  ring.reset();
  EXPECT_FALSE(ring.poll(&v));
  set(d, 50, s);
  ring.push(d.get(), 2.0, s);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  ASSERT_TRUE(ring.poll(&v));
  EXPECT_EQ(v, 25.0);
  cudaStreamDestroy(s);
}

// Extra words and a tag travel with a count: present for a push that gave them, absent for one
// that did not and for push_by, and always those of the newest count returned.
TEST(CountRing, ExtraWordsComeBackWithTheirCount) {
  TWELL_REQUIRE_GPU();
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  DeviceBuffer<unsigned long long> d(1 + CountRing::kExtraWords);
  const unsigned long long vals[1 + CountRing::kExtraWords] = {64, 11, 22, 33};
  ASSERT_EQ(::twell::cuda::test::h2d(d.get(), vals, sizeof vals), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // s (non-blocking) does not wait for the copy's DMA
  CountRing ring(2);
  double v = -1;
  CountRing::Extra e;
  ring.push(d.get(), 8.0, s, d.get() + 1, 4096);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  ASSERT_TRUE(ring.poll(&v, &e));
  EXPECT_EQ(v, 8.0);
  EXPECT_TRUE(e.present);
  EXPECT_EQ(e.words[0], 11u);
  EXPECT_EQ(e.words[1], 22u);
  EXPECT_EQ(e.words[2], 33u);
  EXPECT_EQ(e.tag, 4096);
  ring.push(d.get(), 1.0, s);  // no extra: the next poll says so
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  ASSERT_TRUE(ring.poll(&v, &e));
  EXPECT_EQ(v, 64.0);
  EXPECT_FALSE(e.present);
  ring.push(d.get(), 2.0, s, d.get() + 1, 7);
  ring.push_by(4.0, s, [&](unsigned long long* dst) {
    ASSERT_EQ(cudaMemcpyAsync(dst, d.get(), sizeof *dst, cudaMemcpyDefault, s), cudaSuccess);
  });
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  ASSERT_TRUE(ring.poll(&v, &e));  // the newest is push_by's, without extra words
  EXPECT_EQ(v, 16.0);
  EXPECT_FALSE(e.present);
  cudaStreamDestroy(s);
}

// Under graph capture: poll reads what completed before (no capture error), push publishes
// nothing, push_by's work is captured and writes its count into the sink, never into a slot.
TEST(CountRing, CaptureBakesNothingIntoTheRing) {
  TWELL_REQUIRE_GPU();
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  DeviceBuffer<unsigned long long> d(1), other(1);
  CountRing ring(2);
  set(other, 99, s);
  set(d, 8, s);
  ring.push(d.get(), 1.0, s);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  double v = -1;
  bool polled = false;
  EXPECT_NO_THROW(polled = ring.poll(&v));
  EXPECT_NO_THROW(ring.push(d.get(), 1.0, s));
  EXPECT_NO_THROW(ring.push_by(1.0, s, [&](unsigned long long* dst) {
    ASSERT_EQ(cudaMemcpyAsync(dst, other.get(), sizeof *dst, cudaMemcpyDefault, s), cudaSuccess);
  }));
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  EXPECT_TRUE(polled);
  EXPECT_EQ(v, 8.0);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_FALSE(ring.poll(&v));  // the replay published nothing
  // Outside capture the ring works as before.
  set(d, 12, s);
  ring.push(d.get(), 4.0, s);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  ASSERT_TRUE(ring.poll(&v));
  EXPECT_EQ(v, 3.0);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace twell::cuda::test
