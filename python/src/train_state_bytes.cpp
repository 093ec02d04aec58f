#include "train_state_bytes.hpp"

#include <cstring>

#include "twell/error.hpp"

namespace twell::python {
namespace {

constexpr std::uint64_t kMagic = 0x74776c6c73746174ull;  // "twllstat"
constexpr std::uint64_t kVersion = 1;

struct Writer {
  std::vector<std::uint8_t>& out;
  template <typename T>
  void put(const T& v) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
    out.insert(out.end(), p, p + sizeof(T));
  }
  template <typename T>
  void array(const std::vector<T>& v) {
    put(static_cast<std::uint64_t>(v.size()));
    const auto* p = reinterpret_cast<const std::uint8_t*>(v.data());
    out.insert(out.end(), p, p + v.size() * sizeof(T));
  }
};

struct Reader {
  std::span<const std::uint8_t> in;
  std::size_t at = 0;
  template <typename T>
  T get() {
    TWELL_CHECK(at + sizeof(T) <= in.size(), ErrorCode::corrupt, "twell training state: truncated ({} bytes)", in.size());
    T v;
    std::memcpy(&v, in.data() + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
  template <typename T>
  void array(std::vector<T>& v, std::uint64_t expect) {
    const auto n = get<std::uint64_t>();
    TWELL_CHECK(n == expect, ErrorCode::corrupt, "twell training state: an array of {} elements where {} belong", n, expect);
    TWELL_CHECK(at + n * sizeof(T) <= in.size(), ErrorCode::corrupt, "twell training state: truncated ({} bytes)", in.size());
    v.resize(n);
    std::memcpy(v.data(), in.data() + at, n * sizeof(T));
    at += n * sizeof(T);
  }
};

void write_matrix(Writer& w, const HybridMatrix& h) {
  w.put(static_cast<std::int64_t>(h.rows));
  w.put(static_cast<std::int64_t>(h.cols));
  w.put(static_cast<std::int64_t>(h.ell_width));
  w.put(static_cast<std::int64_t>(h.tail_count()));
  w.array(h.counts);
  w.array(h.ell_cols);
  w.array(h.ell_vals);
  w.array(h.tail_slot);
  w.array(h.tail_rows);
  w.array(h.tail);
}

HybridMatrix read_matrix(Reader& r) {
  HybridMatrix h;
  h.rows = r.get<std::int64_t>();
  h.cols = r.get<std::int64_t>();
  const auto e = r.get<std::int64_t>(), tails = r.get<std::int64_t>();
  TWELL_CHECK(h.rows >= 0 && h.cols >= 0 && e >= 0 && e < (1 << 30) && tails >= 0 && tails <= h.rows, ErrorCode::corrupt,
              "twell training state: bad header (rows {}, cols {}, E {}, tail rows {})", h.rows, h.cols, e, tails);
  h.ell_width = static_cast<int>(e);
  const auto R = static_cast<std::uint64_t>(h.rows), T = static_cast<std::uint64_t>(tails);
  r.array(h.counts, R);
  r.array(h.ell_cols, R * static_cast<std::uint64_t>(e));
  r.array(h.ell_vals, R * static_cast<std::uint64_t>(e));
  r.array(h.tail_slot, R);
  r.array(h.tail_rows, T);
  r.array(h.tail, T * static_cast<std::uint64_t>(h.cols));
  return h;
}

}  // namespace

std::vector<std::uint8_t> state_to_bytes(const cpu::TrainState& s) {
  std::vector<std::uint8_t> out;
  out.reserve(64 + s.bytes());
  Writer w{out};
  w.put(kMagic);
  w.put(kVersion);
  w.put(s.scalars.l1);
  w.put(s.scalars.l0);
  w.put(static_cast<std::uint8_t>(s.r.rows > 0));  // gated: r present
  write_matrix(w, s.p);
  write_matrix(w, s.r);
  return out;
}

cpu::TrainState state_from_bytes(std::span<const std::uint8_t> bytes) {
  Reader r{bytes};
  TWELL_CHECK(r.get<std::uint64_t>() == kMagic, ErrorCode::corrupt, "not a twell training state (bad magic)");
  const auto version = r.get<std::uint64_t>();
  TWELL_CHECK(version == kVersion, ErrorCode::corrupt, "twell training state version {} (this build reads {})", version, kVersion);
  cpu::TrainState s;
  s.scalars.l1 = r.get<double>();
  s.scalars.l0 = r.get<double>();
  const bool gated = r.get<std::uint8_t>() != 0;
  s.p = read_matrix(r);
  s.r = read_matrix(r);
  TWELL_CHECK(r.at == bytes.size(), ErrorCode::corrupt, "twell training state: {} trailing bytes", bytes.size() - r.at);
  hybrid_validate(s.p);
  if (gated)  // r holds u at p's pattern: the same rows, slots and tail rows (its values may be 0)
    TWELL_CHECK(s.r.rows == s.p.rows && s.r.cols == s.p.cols && s.r.ell_width == s.p.ell_width &&
                    s.r.counts == s.p.counts && s.r.ell_cols == s.p.ell_cols && s.r.tail_slot == s.p.tail_slot &&
                    s.r.tail_rows == s.p.tail_rows,
                ErrorCode::corrupt, "twell training state: the up values do not follow the gate's pattern");
  else
    TWELL_CHECK(s.r.rows == 0, ErrorCode::corrupt, "twell training state: up values in a non-gated state");
  return s;
}

}  // namespace twell::python
