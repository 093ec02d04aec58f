#pragma once
// Reads of a mapped file that survive the file being truncated under them.
//
// A model's bf16 tensors are viewed in the checkpoint's mapping (SafetensorsReader::view). If the
// file is truncated in place while it is mapped, touching a page past the new end raises SIGBUS,
// which would kill the process where read() would have returned an error. Every loop that reads
// mapped bytes (the load's finite scan and conversions, the upload's staging copies) runs inside
// read_guarded: a SIGBUS raised on that thread while the loop runs ends the loop, and
// read_guarded returns false so that the caller can report an error naming the file.
//
// Invariants for the function run under the guard: it may be abandoned at any read of the mapping,
// so it must hold no lock, allocate nothing, throw nothing and own nothing with a destructor there,
// and open no OpenMP region (a fault on a worker thread would be unguarded; guard inside each
// worker's iteration instead, as the callers do).
// The guard is per thread (SIGBUS unblocked for the region); a SIGBUS on a thread with no guard
// armed, or one another process sent with kill(), goes to the disposition twell's handler replaced when it was
// installed (at the first guarded read; by default the process dies, as without twell). A handler
// installed later by someone else and not chaining to the one it replaced takes the faults
// inside guarded regions too (Python's faulthandler, for one, reports and re-raises them: the
// guard then still catches the re-raised fault, after its report).
#include <cstddef>
#include <type_traits>

namespace twell::io {

// Runs fn(arg) with the guard armed on this thread. True if it ran to the end; false if a SIGBUS
// interrupted it (what it wrote before then is in place, the rest not). Nests: an inner guard
// catches the faults of its own region.
bool read_guarded(void (*fn)(void*), void* arg) noexcept;

// read_guarded for a callable (it must follow the invariants above).
template <class F>
bool read_guarded(F&& f) noexcept {
  return read_guarded([](void* p) { (*static_cast<std::remove_reference_t<F>*>(p))(); }, &f);
}

// memcpy(dst, src, n) under the guard; false if reading src faulted.
bool copy_guarded(void* dst, const void* src, std::size_t n) noexcept;

}  // namespace twell::io
