#include "twell/io/safetensors.hpp"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

namespace twell::io {

static_assert(std::endian::native == std::endian::little,
              "safetensors is little-endian; this reader copies bytes as they are");

namespace {

using json = nlohmann::json;

// The reference implementation refuses headers over 100 MB; a header that large is corrupt, and
// refusing it early keeps a garbage length from allocating gigabytes.
constexpr std::uint64_t kMaxHeaderBytes = 100ull << 20;

// The dtypes the safetensors format defines, with their element sizes.
struct DtypeInfo {
  const char* name;
  std::size_t size;
};
constexpr DtypeInfo kFormatDtypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2},
    {"U16", 2},  {"F16", 2}, {"BF16", 2}, {"I32", 4},     {"U32", 4},     {"F32", 4},
    {"F64", 8},  {"I64", 8}, {"U64", 8},
};

const DtypeInfo* format_dtype(const std::string& s) {
  for (const auto& d : kFormatDtypes)
    if (s == d.name) return &d;
  return nullptr;
}

const char* safetensors_dtype(DType dt) {
  switch (dt) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::i32: return "I32";
    case DType::u32: return "U32";
  }
  return "?";
}

std::string shape_str(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// IEEE binary16 → binary32, exact (every half is a float).
float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // Inf / NaN (payload kept)
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;  // ±0
  } else {
    // Subnormal half: normalise. value = mant · 2^-24.
    int e = -1;
    do {
      mant <<= 1;
      ++e;
    } while ((mant & 0x400u) == 0);
    bits = sign | (static_cast<std::uint32_t>(112 - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

// One tensor's header entry after validation.
struct Entry {
  std::string name;
  std::string file_dtype;  // as written in the header
  DType dtype;             // as it will be held in memory
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;
};

struct Header {
  std::vector<Entry> entries;  // sorted by data offset
  std::map<std::string, std::string> metadata;
};

std::uint64_t read_u64_le(const std::byte* p) {
  std::uint64_t v = 0;
  std::memcpy(&v, p, 8);
  return v;
}

std::uint64_t checked_offset(const json& v, const std::string& what, const std::string& tensor, const char* field) {
  if (!v.is_number_integer())
    fail(ErrorCode::corrupt, "{}: tensor '{}': {} must hold non-negative integers, got {}", what, tensor, field,
         v.dump());
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  const std::int64_t s = v.get<std::int64_t>();
  if (s < 0) fail(ErrorCode::corrupt, "{}: tensor '{}': negative value {} in {}", what, tensor, s, field);
  return static_cast<std::uint64_t>(s);
}

Header parse_header(std::string_view text, std::uint64_t data_size, const std::string& what, ReadOptions opt) {
  // Duplicate keys: nlohmann keeps the last one silently, so track each object's keys while parsing.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  json::parser_callback_t cb = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start: open_objects.emplace_back(); break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key:
        if (!open_objects.empty() && parsed.is_string() &&
            !open_objects.back().insert(parsed.get<std::string>()).second && duplicate.empty())
          duplicate = parsed.get<std::string>();
        break;
      default: break;
    }
    return true;
  };

  json doc;
  try {
    doc = json::parse(text.begin(), text.end(), cb);
  } catch (const json::exception& e) {
    fail(ErrorCode::corrupt, "{}: the header is not valid JSON ({}); the file is corrupt or not a safetensors file",
         what, e.what());
  }
  if (!duplicate.empty()) fail(ErrorCode::corrupt, "{}: duplicate name '{}' in the header", what, duplicate);
  if (!doc.is_object())
    fail(ErrorCode::corrupt, "{}: the header must be a JSON object, got a JSON {}", what, doc.type_name());

  Header h;
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) fail(ErrorCode::corrupt, "{}: __metadata__ must be an object of strings", what);
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          fail(ErrorCode::corrupt, "{}: __metadata__ value of '{}' must be a string, got {}", what, m.key(),
               m.value().dump());
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (name.empty()) fail(ErrorCode::corrupt, "{}: a tensor has an empty name", what);
    if (!v.is_object()) fail(ErrorCode::corrupt, "{}: entry of tensor '{}' must be an object", what, name);
    for (auto f = v.begin(); f != v.end(); ++f)
      if (f.key() != "dtype" && f.key() != "shape" && f.key() != "data_offsets")
        fail(ErrorCode::corrupt, "{}: tensor '{}' has an unexpected field '{}'", what, name, f.key());
    for (const char* field : {"dtype", "shape", "data_offsets"})
      if (!v.contains(field)) fail(ErrorCode::corrupt, "{}: tensor '{}' has no '{}' field", what, name, field);

    Entry e;
    e.name = name;
    const json& jd = v["dtype"];
    if (!jd.is_string()) fail(ErrorCode::corrupt, "{}: tensor '{}': dtype must be a string", what, name);
    e.file_dtype = jd.get<std::string>();
    const DtypeInfo* info = format_dtype(e.file_dtype);
    if (!info)
      fail(ErrorCode::corrupt, "{}: tensor '{}' has unknown dtype '{}' (safetensors defines F32, BF16, F16, F64, "
           "I64, I32, ...)", what, name, e.file_dtype);
    if (e.file_dtype == "F32") e.dtype = DType::f32;
    else if (e.file_dtype == "BF16") e.dtype = DType::bf16;
    else if (e.file_dtype == "I32") e.dtype = DType::i32;
    else if (e.file_dtype == "U32") e.dtype = DType::u32;
    else if (e.file_dtype == "F16" && opt.f16_to_f32) e.dtype = DType::f32;
    else if (e.file_dtype == "F16")
      fail(ErrorCode::dtype_mismatch, "{}: tensor '{}' has dtype F16, which twell does not read; store it as F32 "
           "or BF16", what, name);
    else
      fail(ErrorCode::dtype_mismatch, "{}: tensor '{}' has dtype {}, which twell does not read (F32, BF16, I32, "
           "U32 only)", what, name, e.file_dtype);

    const json& js = v["shape"];
    if (!js.is_array()) fail(ErrorCode::corrupt, "{}: tensor '{}': shape must be an array", what, name);
    // numel · size, saturating: a product past 2^64 is reported as such instead of wrapping around.
    std::uint64_t bytes = info->size;
    bool too_big = false, has_zero = false;
    for (const json& d : js) {
      const std::uint64_t dim = checked_offset(d, what, name, "shape");
      if (dim > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        fail(ErrorCode::corrupt, "{}: tensor '{}': dimension {} is too large", what, name, dim);
      e.shape.push_back(static_cast<std::int64_t>(dim));
      has_zero |= dim == 0;
      if (dim != 0 && bytes > std::numeric_limits<std::uint64_t>::max() / dim) too_big = true;
      else bytes *= dim;
    }
    if (has_zero) bytes = 0, too_big = false;

    const json& jo = v["data_offsets"];
    if (!jo.is_array() || jo.size() != 2)
      fail(ErrorCode::corrupt, "{}: tensor '{}': data_offsets must be an array [begin, end]", what, name);
    e.begin = checked_offset(jo[0], what, name, "data_offsets");
    e.end = checked_offset(jo[1], what, name, "data_offsets");
    if (e.end < e.begin)
      fail(ErrorCode::corrupt, "{}: tensor '{}': data_offsets [{}, {}] end before they begin", what, name, e.begin,
           e.end);
    if (e.end > data_size)
      fail(ErrorCode::corrupt, "{}: tensor '{}': data_offsets [{}, {}] run past the end of the data ({} bytes): the "
           "file is truncated or the offsets are corrupt", what, name, e.begin, e.end, data_size);
    if (too_big || e.end - e.begin != bytes)
      fail(ErrorCode::corrupt, "{}: tensor '{}': data_offsets [{}, {}] span {} bytes, but shape {} of {} needs {}",
           what, name, e.begin, e.end, e.end - e.begin, shape_str(e.shape), e.file_dtype,
           too_big ? std::string("more than 2^64") : std::to_string(bytes));
    h.entries.push_back(std::move(e));
  }

  // The tensors must tile the data buffer exactly: sorted by offset, each starts where the last ended.
  std::sort(h.entries.begin(), h.entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t pos = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : h.entries) {
    if (e.begin < pos)
      fail(ErrorCode::corrupt, "{}: tensors '{}' [{}, {}) and '{}' [{}, {}) overlap", what, prev->name, prev->begin,
           prev->end, e.name, e.begin, e.end);
    if (e.begin > pos)
      fail(ErrorCode::corrupt, "{}: {} unused bytes before tensor '{}' (offset {}); tensors must cover the data "
           "buffer without gaps", what, e.begin - pos, e.name, e.begin);
    pos = e.end;
    prev = &e;
  }
  if (pos != data_size)
    fail(ErrorCode::corrupt, "{}: {} bytes after the last tensor; the data buffer has {} bytes but the tensors "
         "cover {}", what, data_size - pos, data_size, pos);
  return h;
}

// Fills a tensor from the raw little-endian bytes of its entry.
HostTensor make_tensor(const Entry& e, const std::byte* raw) {
  HostTensor t(e.dtype, e.shape);
  if (e.file_dtype == "F16") {
    float* out = t.data<float>();
    const std::int64_t n = t.numel();
    for (std::int64_t i = 0; i < n; ++i) {
      std::uint16_t h;
      std::memcpy(&h, raw + 2 * i, 2);
      out[i] = half_to_float(h);
    }
  } else if (t.nbytes() > 0) {
    std::memcpy(t.bytes(), raw, t.nbytes());
  }
  return t;
}

std::uint64_t header_length(std::span<const std::byte> prefix, std::uint64_t total, const std::string& what) {
  if (total < 8)
    fail(ErrorCode::corrupt, "{}: truncated: {} bytes, shorter than the 8-byte header length of a safetensors file",
         what, total);
  const std::uint64_t n = read_u64_le(prefix.data());
  if (n > total - 8)
    fail(ErrorCode::corrupt, "{}: header length {} runs past the end of the file ({} bytes): the file is truncated or "
         "not a safetensors file", what, n, total);
  if (n > kMaxHeaderBytes)
    fail(ErrorCode::corrupt, "{}: header length {} exceeds the 100 MB limit; not a safetensors file", what, n);
  if (n < 2) fail(ErrorCode::corrupt, "{}: header length {} is too short to hold a JSON object", what, n);
  return n;
}

std::string errno_text() { return std::strerror(errno); }

}  // namespace

const HostTensor* SafetensorsFile::find(const std::string& name) const noexcept {
  for (const auto& t : tensors)
    if (t.name == name) return &t.tensor;
  return nullptr;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& t : tensors) out.push_back(t.name);
  return out;
}

SafetensorsFile parse_safetensors(std::span<const std::byte> bytes, const std::string& what, ReadOptions opt) {
  const std::uint64_t total = bytes.size();
  const std::uint64_t n = header_length(bytes, total, what);
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()) + 8, n);
  Header h = parse_header(text, total - 8 - n, what, opt);
  SafetensorsFile f;
  f.metadata = std::move(h.metadata);
  const std::byte* data = bytes.data() + 8 + n;
  for (const Entry& e : h.entries) f.tensors.push_back({e.name, make_tensor(e, data + e.begin)});
  return f;
}

namespace {
SafetensorsReader::FileId file_id_of(const struct stat& st) {
  return {static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino),
          static_cast<std::uint64_t>(st.st_size),
          static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}
}  // namespace

struct SafetensorsReader::Impl {
  std::string path;
  std::ifstream in;
  std::uint64_t data_start = 0;  // the data buffer's offset in the file
  std::vector<Entry> entries;    // sorted by data offset
  std::vector<Info> infos;       // the same order
  std::map<std::string, std::size_t> index;
  std::map<std::string, std::string> metadata;
  std::vector<std::byte> raw;  // an F16 tensor's file bytes before conversion
  std::uint64_t total = 0;     // the file's size
  std::shared_ptr<const std::byte> mapped;  // the whole file, read-only (view()); null until then
  bool unmappable = false;                  // mmap failed once: views stay empty
  int fd = -1;       // the file the header was read from (checked at open), mapped by view()
  FileId id;         // its identity and state at open

  ~Impl() {
    if (fd >= 0) ::close(fd);
  }

  const Entry& entry(const std::string& name) const {
    const auto it = index.find(name);
    if (it == index.end()) fail(ErrorCode::invalid_argument, "'{}' has no tensor '{}'", path, name);
    return entries[it->second];
  }
};

SafetensorsReader::SafetensorsReader(const std::string& path, ReadOptions opt) : impl_(std::make_unique<Impl>()) {
  namespace fs = std::filesystem;
  Impl& m = *impl_;
  m.path = path;
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (ec || !fs::exists(st)) fail(ErrorCode::io, "cannot open '{}': no such file", path);
  if (fs::is_directory(st)) fail(ErrorCode::io, "cannot read '{}': it is a directory", path);
  // A descriptor for view()'s mapping and the file's identity, opened before the stream; the
  // stream must then name the same file (not one renamed over it in between).
  m.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (m.fd < 0) fail(ErrorCode::io, "cannot open '{}': {}", path, errno_text());
  struct stat fst {};
  if (::fstat(m.fd, &fst) != 0) fail(ErrorCode::io, "cannot stat '{}': {}", path, errno_text());
  m.id = file_id_of(fst);
  m.in.open(path, std::ios::binary);
  if (!m.in) fail(ErrorCode::io, "cannot open '{}': {}", path, errno_text());
  const std::optional<FileId> now = stat_file(path);
  if (!now || now->inode != m.id.inode || now->device != m.id.device)
    fail(ErrorCode::io, "'{}' was replaced while being opened: read it again", path);
  m.in.seekg(0, std::ios::end);
  const std::streamoff size = m.in.tellg();
  if (size < 0) fail(ErrorCode::io, "cannot read '{}': not a regular file", path);
  m.in.seekg(0);
  const std::uint64_t total = static_cast<std::uint64_t>(size);
  m.total = total;

  std::byte prefix[8] = {};
  if (total >= 8 && !m.in.read(reinterpret_cast<char*>(prefix), 8)) fail(ErrorCode::io, "cannot read '{}'", path);
  const std::uint64_t n = header_length(prefix, total, path);
  std::string text(n, '\0');
  if (!m.in.read(text.data(), static_cast<std::streamsize>(n)))
    fail(ErrorCode::io, "cannot read the header of '{}'", path);
  Header h = parse_header(text, total - 8 - n, path, opt);
  m.data_start = 8 + n;
  m.metadata = std::move(h.metadata);
  m.entries = std::move(h.entries);
  for (std::size_t i = 0; i < m.entries.size(); ++i) {
    const Entry& e = m.entries[i];
    std::uint64_t numel = 1;
    for (const std::int64_t d : e.shape) numel *= static_cast<std::uint64_t>(d);
    m.infos.push_back({e.name, e.dtype, e.shape, numel * dtype_size(e.dtype)});
    m.index.emplace(e.name, i);
  }
}

SafetensorsReader::~SafetensorsReader() = default;
SafetensorsReader::SafetensorsReader(SafetensorsReader&&) noexcept = default;
SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&&) noexcept = default;

const std::string& SafetensorsReader::path() const noexcept { return impl_->path; }
const std::map<std::string, std::string>& SafetensorsReader::metadata() const noexcept { return impl_->metadata; }
const std::vector<SafetensorsReader::Info>& SafetensorsReader::tensors() const noexcept { return impl_->infos; }

const SafetensorsReader::Info* SafetensorsReader::find(const std::string& name) const noexcept {
  const auto it = impl_->index.find(name);
  return it == impl_->index.end() ? nullptr : &impl_->infos[it->second];
}

void SafetensorsReader::read_into(const std::string& name, std::span<std::byte> dst) {
  Impl& m = *impl_;
  const Entry& e = m.entry(name);
  const Info& info = m.infos[m.index.at(name)];
  TWELL_CHECK(dst.size() == info.bytes, ErrorCode::invalid_argument, "'{}': tensor '{}' holds {} bytes, not {}", m.path,
              name, info.bytes, dst.size());
  const std::uint64_t len = e.end - e.begin;
  const bool f16 = e.file_dtype == "F16";
  if (f16) m.raw.resize(len);
  std::byte* into = f16 ? m.raw.data() : dst.data();
  m.in.clear();
  m.in.seekg(static_cast<std::streamoff>(m.data_start + e.begin));
  if (len && !m.in.read(reinterpret_cast<char*>(into), static_cast<std::streamsize>(len)))
    fail(ErrorCode::io, "cannot read tensor '{}' of '{}'", e.name, m.path);
  if (f16) {
    const HostTensor t = make_tensor(e, m.raw.data());
    std::memcpy(dst.data(), t.bytes(), dst.size());
  }
}

const SafetensorsReader::FileId& SafetensorsReader::file_id() const noexcept { return impl_->id; }

std::optional<SafetensorsReader::FileId> SafetensorsReader::stat_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return file_id_of(st);
}

bool SafetensorsReader::viewed() const noexcept { return impl_->mapped && impl_->mapped.use_count() > 1; }

SafetensorsReader::View SafetensorsReader::view(const std::string& name) {
  Impl& m = *impl_;
  const Entry& e = m.entry(name);
  if (e.file_dtype == "F16" || e.end == e.begin) return {};
  if (!m.mapped && !m.unmappable) {
    // The file the header was read from; not if it was changed in place since (its offsets would
    // not hold, and a shorter file faults where the mapping passes its end).
    struct stat st {};
    if (::fstat(m.fd, &st) != 0 || file_id_of(st).size != m.id.size || file_id_of(st).mtime_ns != m.id.mtime_ns)
      fail(ErrorCode::io, "'{}' was changed in place since it was opened: read it again", m.path);
    void* p = ::mmap(nullptr, m.total, PROT_READ, MAP_PRIVATE, m.fd, 0);
    if (p == MAP_FAILED) {
      m.unmappable = true;
    } else {
      const std::size_t len = m.total;
      m.mapped = std::shared_ptr<const std::byte>(static_cast<const std::byte*>(p),
                                                  [len](const std::byte* q) { ::munmap(const_cast<std::byte*>(q), len); });
    }
  }
  if (!m.mapped) return {};
  return {m.mapped, std::span<const std::byte>(m.mapped.get() + m.data_start + e.begin, e.end - e.begin)};
}

HostTensor SafetensorsReader::read(const std::string& name) {
  const Entry& e = impl_->entry(name);
  HostTensor t(e.dtype, e.shape);
  read_into(name, std::span<std::byte>(t.bytes(), t.nbytes()));
  return t;
}

SafetensorsFile read_safetensors(const std::string& path, ReadOptions opt) {
  // Entries are sorted and cover the data buffer without gaps, so reading them in order is one
  // sequential pass.
  SafetensorsReader r(path, opt);
  SafetensorsFile f;
  f.metadata = r.metadata();
  for (const auto& info : r.tensors()) f.tensors.push_back({info.name, r.read(info.name)});
  return f;
}

std::vector<std::byte> serialize_safetensors(const std::vector<TensorRef>& tensors,
                                             const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = m;
  }
  std::set<std::string> seen;
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    TWELL_CHECK(t.tensor != nullptr, ErrorCode::invalid_argument, "tensor '{}' is null", t.name);
    TWELL_CHECK(!t.name.empty(), ErrorCode::invalid_argument, "a tensor to write has an empty name");
    TWELL_CHECK(t.name.rfind("__", 0) != 0, ErrorCode::invalid_argument,
                "tensor name '{}' is reserved (names starting with \"__\")", t.name);
    TWELL_CHECK(seen.insert(t.name).second, ErrorCode::invalid_argument, "duplicate tensor name '{}'", t.name);
    nlohmann::ordered_json e;
    e["dtype"] = safetensors_dtype(t.tensor->dtype());
    e["shape"] = t.tensor->shape();
    e["data_offsets"] = {offset, offset + t.tensor->nbytes()};
    header[t.name] = e;
    offset += t.tensor->nbytes();
  }
  std::string text = header.dump();
  // Pad with spaces so the data buffer starts 8-byte aligned (as the reference writer does).
  text.append((8 - text.size() % 8) % 8, ' ');

  std::vector<std::byte> out(8 + text.size() + offset);
  const std::uint64_t n = text.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, text.data(), text.size());
  std::byte* p = out.data() + 8 + text.size();
  for (const auto& t : tensors) {
    if (t.tensor->nbytes()) std::memcpy(p, t.tensor->bytes(), t.tensor->nbytes());
    p += t.tensor->nbytes();
  }
  return out;
}

void write_safetensors(const std::string& path, const std::vector<TensorRef>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  namespace fs = std::filesystem;
  const std::vector<std::byte> bytes = serialize_safetensors(tensors, metadata);
  std::error_code ec;
  if (fs::is_directory(path, ec)) fail(ErrorCode::io, "cannot write '{}': it is a directory", path);
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail(ErrorCode::io, "cannot write '{}': {}", path, errno_text());
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) {
      const std::string why = errno_text();
      fs::remove(tmp, ec);
      fail(ErrorCode::io, "cannot write '{}': {}", path, why);
    }
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignore;
    fs::remove(tmp, ignore);
    fail(ErrorCode::io, "cannot write '{}': {}", path, ec.message());
  }
}

HostTensor scalar_f32(float value) {
  HostTensor t(DType::f32, {});
  *t.data<float>() = value;
  return t;
}

}  // namespace twell::io
