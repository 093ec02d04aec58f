// read_guarded (twell/io/mapped_reads.hpp): a SIGBUS handler installed once per process, and per
// thread the innermost armed region's jump buffer. The handler jumps back into read_guarded's
// frame when this thread has a region armed and the signal is a fault (not a SIGBUS another
// process sent with kill); otherwise it hands the signal to the disposition it replaced (that handler is called; a
// default disposition is restored and the signal raised again, which ends the process as it would
// have without twell).
#include "twell/io/mapped_reads.hpp"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <csetjmp>
#include <csignal>
#include <cstring>
#include <mutex>

namespace twell::io {
namespace {

// The innermost armed region of this thread (null: none). Initial-exec TLS, also in a dlopen'd
// module (the Python extension; 8 bytes of the static TLS reserve): the handler reads it without
// __tls_get_addr, which may allocate on a thread's first access.
__attribute__((tls_model("initial-exec"))) thread_local sigjmp_buf* g_armed = nullptr;
struct sigaction g_previous {};

// A fault: raised by the kernel, or raised again inside this process (a handler installed over
// twell's, as Python's faulthandler, reports a fault and raises it again) — not a SIGBUS that
// another process sent with kill().
bool is_fault(const siginfo_t* info) { return info && (info->si_code > 0 || info->si_pid == getpid()); }

void on_sigbus(int sig, siginfo_t* info, void* ctx) {
  if (sigjmp_buf* to = g_armed; to && is_fault(info)) siglongjmp(*to, 1);
  // Not ours: what would have happened without twell.
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction) return g_previous.sa_sigaction(sig, info, ctx);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN && g_previous.sa_handler) {
    return g_previous.sa_handler(sig);
  }
  if (g_previous.sa_handler == SIG_IGN && !(info && info->si_code > 0)) return;  // not the kernel's: ignored
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGBUS, &dfl, nullptr);
  raise(sig);  // pending until the handler returns, then the default action
}

void install_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    sigaction(SIGBUS, nullptr, &g_previous);  // read before ours is in place: the handler may run at once
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;  // (the jump back restores the region's signal mask: SIGBUS unblocked)
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, nullptr);
  });
}

}  // namespace

bool read_guarded(void (*fn)(void*), void* arg) noexcept {
  install_once();
  // A fault while SIGBUS is blocked takes the default action whatever the handler: unblock it for
  // the region (the jump and the normal exit both restore the caller's mask).
  sigset_t bus, before;
  sigemptyset(&bus);
  sigaddset(&bus, SIGBUS);
  pthread_sigmask(SIG_UNBLOCK, &bus, &before);
  const bool was_blocked = sigismember(&before, SIGBUS) == 1;
  sigjmp_buf* const outer = g_armed;
  sigjmp_buf here;
  volatile bool ran = false;  // (volatile: read after a jump back)
  // savemask = 1: the jump restores the mask as it is now (SIGBUS unblocked).
  if (sigsetjmp(here, 1) == 0) {
    g_armed = &here;
    std::atomic_signal_fence(std::memory_order_seq_cst);  // armed before fn's first read, for the handler
    fn(arg);
    std::atomic_signal_fence(std::memory_order_seq_cst);  // disarmed only after fn's last read
    ran = true;
  }
  g_armed = outer;
  if (was_blocked) pthread_sigmask(SIG_SETMASK, &before, nullptr);
  return ran;
}

bool copy_guarded(void* dst, const void* src, std::size_t n) noexcept {
  return read_guarded([&] { std::memcpy(dst, src, n); });
}

}  // namespace twell::io
