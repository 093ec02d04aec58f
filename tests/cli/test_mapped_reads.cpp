// io::read_guarded / copy_guarded: reads of a mapping whose file was truncated under it end with
// false, not SIGBUS; healthy reads copy every byte; guards are per thread and nest; a fault outside
// any guard still ends the process as it would without twell.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "twell/io/mapped_reads.hpp"

namespace {

namespace fs = std::filesystem;
using twell::io::copy_guarded;
using twell::io::read_guarded;

// A file of `bytes` bytes (byte i = i mod 251) mapped read-only; truncate() cuts the file to
// `keep` bytes while it stays mapped.
struct MappedFile {
  std::string path;
  int fd = -1;
  std::size_t size = 0;
  const unsigned char* p = nullptr;

  explicit MappedFile(std::size_t bytes) : size(bytes) {
    path = (fs::temp_directory_path() / ("twell_mapped_" + std::to_string(::getpid()) + "_" +
                                         std::to_string(reinterpret_cast<std::uintptr_t>(this))))
               .string();
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    std::vector<unsigned char> data(bytes);
    for (std::size_t i = 0; i < bytes; ++i) data[i] = static_cast<unsigned char>(i % 251);
    EXPECT_EQ(::write(fd, data.data(), bytes), static_cast<ssize_t>(bytes));
    void* m = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
    EXPECT_NE(m, MAP_FAILED);
    p = static_cast<const unsigned char*>(m);
  }
  void truncate(std::size_t keep) const { EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(keep)), 0); }
  ~MappedFile() {
    ::munmap(const_cast<unsigned char*>(p), size);
    ::close(fd);
    fs::remove(path);
  }
};

constexpr std::size_t kPage = 4096;

TEST(MappedReads, HealthyReadsCopyEveryByte) {
  const MappedFile f(10 * kPage + 123);
  std::vector<unsigned char> out(f.size);
  ASSERT_TRUE(copy_guarded(out.data(), f.p, f.size));
  for (std::size_t i = 0; i < f.size; ++i) ASSERT_EQ(out[i], i % 251) << i;
  EXPECT_TRUE(copy_guarded(out.data(), f.p, 0));
}

TEST(MappedReads, ATruncatedFileIsAFailedReadNotACrash) {
  const MappedFile f(16 * kPage);
  f.truncate(4 * kPage);
  std::vector<unsigned char> out(f.size, 0);
  EXPECT_FALSE(copy_guarded(out.data(), f.p, f.size));  // pages 4 … 15 are past the end
  // What lies before the new end still reads, and the guard works again after a fault (the
  // signal mask is restored: a second fault is delivered too).
  EXPECT_TRUE(copy_guarded(out.data(), f.p, 4 * kPage));
  EXPECT_EQ(out[4 * kPage - 1], (4 * kPage - 1) % 251);
  unsigned sum = 0;
  EXPECT_FALSE(read_guarded([&] {
    for (std::size_t i = 0; i < f.size; i += 64) sum += f.p[i];
  }));
  EXPECT_FALSE(copy_guarded(out.data(), f.p + 8 * kPage, kPage));
}

TEST(MappedReads, GuardsNestAndBelongToTheirThread) {
  const MappedFile bad(8 * kPage), good(8 * kPage);
  bad.truncate(0);
  bool inner = true;
  // The inner region's fault is the inner region's; the outer one goes on and ends well.
  EXPECT_TRUE(read_guarded([&] { inner = copy_guarded(std::vector<unsigned char>(kPage).data(), bad.p, kPage); }));
  EXPECT_FALSE(inner);
  // Four threads at once, two reading the truncated file: each gets its own answer.
  bool got[4] = {};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      std::vector<unsigned char> out(8 * kPage);
      bool all = true;
      for (int r = 0; r < 50; ++r) all = copy_guarded(out.data(), t % 2 ? bad.p : good.p, out.size()) && all;
      got[t] = all;
    });
  for (std::thread& t : ts) t.join();
  EXPECT_TRUE(got[0]);
  EXPECT_FALSE(got[1]);
  EXPECT_TRUE(got[2]);
  EXPECT_FALSE(got[3]);
}

TEST(MappedReads, AGuardWorksWithSigbusBlockedAndKeepsTheMask) {
  const MappedFile f(4 * kPage);
  f.truncate(0);
  sigset_t bus, was, now;
  sigemptyset(&bus);
  sigaddset(&bus, SIGBUS);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &bus, &was), 0);
  EXPECT_FALSE(copy_guarded(std::vector<unsigned char>(kPage).data(), f.p, kPage));
  ASSERT_EQ(pthread_sigmask(SIG_SETMASK, &was, &now), 0);
  EXPECT_EQ(sigismember(&now, SIGBUS), 1) << "the caller's mask (SIGBUS blocked) was not restored";
}

void exit_42(int) { std::_Exit(42); }

TEST(MappedReadsDeathTest, AFaultOutsideAGuardGoesToTheHandlerBeforeTwells) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        struct sigaction sa {};
        sa.sa_handler = exit_42;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGBUS, &sa, nullptr);
        const MappedFile f(4 * kPage);
        EXPECT_TRUE(copy_guarded(std::vector<unsigned char>(kPage).data(), f.p, kPage));  // twell's installed
        f.truncate(0);
        EXPECT_FALSE(copy_guarded(std::vector<unsigned char>(kPage).data(), f.p, kPage));  // still guarded
        volatile unsigned char c = f.p[2 * kPage];  // unguarded: the handler twell replaced
        (void)c;
        std::_Exit(0);
      },
      testing::ExitedWithCode(42), "");
}

// A handler installed over twell's that reports a fault and raises it again (Python's faulthandler
// does): inside a guard the re-raised signal is still the fault.
TEST(MappedReads, AFaultRaisedAgainInTheProcessIsStillCaught) {
  EXPECT_FALSE(read_guarded([] { raise(SIGBUS); }));
}

TEST(MappedReadsDeathTest, ASigbusFromAnotherProcessIsNotTakenForAFault) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        (void)read_guarded([] {
          if (::fork() == 0) {  // the child sends it while the parent waits inside the guard
            ::kill(::getppid(), SIGBUS);
            std::_Exit(0);
          }
          for (;;) ::pause();
        });
        std::_Exit(0);  // reached only if the guard took the signal for a fault
      },
      testing::KilledBySignal(SIGBUS), "");
}

TEST(MappedReadsDeathTest, AFaultOutsideAGuardStillEndsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const MappedFile f(4 * kPage);
        EXPECT_TRUE(copy_guarded(std::vector<unsigned char>(kPage).data(), f.p, kPage));  // handler installed
        f.truncate(0);
        volatile unsigned char c = f.p[2 * kPage];  // no guard: SIGBUS, as without twell
        (void)c;
        std::_Exit(0);
      },
      testing::KilledBySignal(SIGBUS), "");
}

}  // namespace
