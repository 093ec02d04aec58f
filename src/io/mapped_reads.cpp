// read_guarded (twell/io/mapped_reads.hpp): a SIGBUS handler installed once per process, and per
// thread the innermost armed region's jump buffer. The handler jumps back into read_guarded's
// frame when this thread has a region armed; otherwise it hands the signal to the previous
// disposition (a previous handler is called; the default is restored and the fault re-raised).
#include "twell/io/mapped_reads.hpp"

#include <csetjmp>
#include <csignal>
#include <cstring>
#include <mutex>

namespace twell::io {
namespace {

// The innermost armed region of this thread (null: none). Initial-exec TLS in every build we
// make; read_guarded touches it before arming, so the handler never makes the first access.
thread_local sigjmp_buf* g_armed = nullptr;
struct sigaction g_previous {};

void on_sigbus(int sig, siginfo_t* info, void* ctx) {
  if (sigjmp_buf* to = g_armed) siglongjmp(*to, 1);
  // Not ours: what would have happened without twell.
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction) return g_previous.sa_sigaction(sig, info, ctx);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN && g_previous.sa_handler) {
    return g_previous.sa_handler(sig);
  }
  // The default (or ignored, which cannot hold for a fault): restore it; returning re-executes the
  // faulting access, which now kills the process as it would have.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGBUS, &dfl, nullptr);
}

void install_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;  // (the jump back restores the region's signal mask: SIGBUS unblocked)
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &g_previous);
  });
}

}  // namespace

bool read_guarded(void (*fn)(void*), void* arg) noexcept {
  install_once();
  sigjmp_buf* const outer = g_armed;
  sigjmp_buf here;
  // savemask = 1: the jump restores the signal mask the region started with.
  if (sigsetjmp(here, 1) != 0) {
    g_armed = outer;
    return false;
  }
  g_armed = &here;
  fn(arg);
  g_armed = outer;
  return true;
}

bool copy_guarded(void* dst, const void* src, std::size_t n) noexcept {
  return read_guarded([&] { std::memcpy(dst, src, n); });
}

}  // namespace twell::io
