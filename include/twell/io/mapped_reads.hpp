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
// so no lock may be held and no exception thrown there, and no destructor it owns will run (memory
// allocated inside before the reads leaks on a fault; the load fails anyway).
// The guard is per thread; a SIGBUS on a thread with no guard armed goes to the handler that was
// installed before twell's (by default: the process dies, as without twell).
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
