// Prefill attention through cuDNN's fused SDPA (see cudnn_attention.hpp).
#include "model/cudnn_attention.hpp"

#include <cudnn.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <map>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cuda/common/check.hpp"
#include "cuda/common/device_buffer.hpp"

#define CUDNN_FRONTEND_SKIP_JSON_LIB 1
#include <cudnn_frontend.h>

namespace twell::model {
namespace fe = cudnn_frontend;
namespace {

// The graph's tensor ids (the variant pack maps them to device pointers at each call).
enum Uid : fe::graph::Tensor_attributes::uid_t {
  kQ = 1, kK, kV, kO, kSeqLen, kSeqLenKv, kRaggedQ, kRaggedK, kRaggedV, kRaggedO
};

// The longest sequence is rounded up (the padding mask covers the rest), so that a few graphs
// serve every call; the sequence count is not (one graph per count seen).
std::int64_t bucket(std::int64_t v, std::int64_t least) {
  std::int64_t b = least;
  while (b < v) b *= 2;
  return b;
}

// A call's graph key: (sequences, rows, ragged). Sequences of one bucket length packed from row 0
// (a batch of equal prompts of 64, 128, 256, … tokens) take the plain layout; other lengths the
// ragged graph of their bucket, so that the graphs stay few (each costs a build) whatever lengths
// single prompts have. rows 0: nothing to attend (or int32 offsets would overflow: `row` values a
// row of qkv). With it, the end of the call's last row (the ragged offsets' end).
using Key = std::tuple<std::int64_t, std::int64_t, bool>;
struct Shape {
  Key key{0, 0, false};
  std::int64_t last_row = 0;
};
Shape shape_of(std::span<const std::int64_t> row0, std::span<const std::int64_t> len, std::int64_t row) {
  const auto n = static_cast<std::int64_t>(row0.size());
  if (n == 0 || len.size() != row0.size()) return {};
  std::int64_t longest = 0, last_row = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    longest = std::max(longest, len[static_cast<std::size_t>(i)]);
    last_row = std::max(last_row, row0[static_cast<std::size_t>(i)] + len[static_cast<std::size_t>(i)]);
  }
  if (longest <= 0 || last_row * row > INT_MAX) return {};  // int32 offsets
  bool uniform = longest == bucket(longest, 64);
  for (std::int64_t i = 0; i < n; ++i)
    uniform = uniform && len[static_cast<std::size_t>(i)] == longest && row0[static_cast<std::size_t>(i)] == i * longest;
  return {{n, uniform ? longest : bucket(longest, 64), !uniform}, last_row};
}

}  // namespace

struct CudnnAttention::Impl {
  std::int64_t heads = 0, kv_heads = 0, d = 0;
  cudnnHandle_t handle = nullptr;
  struct Plan {
    std::shared_ptr<fe::graph::Graph> graph;  // null: cuDNN refused this shape
    std::int64_t workspace = 0;
  };
  // (sequences, rows, ragged): ragged graphs per bucket of the longest sequence, with offsets and a
  // padding mask; dense ones for b sequences of exactly s rows each, packed back to back.
  std::map<Key, Plan> plans;
  std::map<Key, int> seen;  // calls of each key without a graph yet (wanted())
  cuda::DeviceBuffer<std::int32_t> seq_len, ragged_qkv, ragged_o;
  cuda::DeviceBuffer<unsigned char> workspace;
  std::string refusal;                 // why cuDNN refused the latest shape it refused ("" if none)
  std::vector<std::int32_t> host;      // staging for the three int32 arrays
  std::vector<std::int32_t> uploaded;  // what the device arrays hold (at uploaded_to)
  const std::int32_t* uploaded_to = nullptr;

  ~Impl() {
    if (handle) cudnnDestroy(handle);
  }

  // Builds the graph for `b` sequences of at most `s` rows (ragged) or of exactly `s` rows each,
  // sequence i at rows [i·s, (i + 1)·s) (not ragged: no offsets, no padding mask, the layout
  // PyTorch's SDPA hands cuDNN); a null graph where cuDNN refuses it.
  Plan build(std::int64_t b, std::int64_t s, bool ragged) {
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    const std::int64_t row = (heads + 2 * kv_heads) * d;  // a qkv row's elements
    auto int_vec = [&](const char* name, Uid uid, std::int64_t n) {
      return g->tensor(fe::graph::Tensor_attributes()
                           .set_name(name)
                           .set_uid(uid)
                           .set_dim({n, 1, 1, 1})
                           .set_stride({1, 1, 1, 1})
                           .set_data_type(fe::DataType_t::INT32));
    };
    auto packed = [&](const char* name, Uid uid, std::int64_t h, Uid ragged_uid, const char* ragged_name) {
      auto t = fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim({b, h, s, d}).set_stride(
          {s * row, d, row, 1});
      if (ragged) t.set_ragged_offset(int_vec(ragged_name, ragged_uid, b + 1));
      return g->tensor(t);
    };
    auto q = packed("q", kQ, heads, kRaggedQ, "ragged_q");
    auto k = packed("k", kK, kv_heads, kRaggedK, "ragged_k");
    auto v = packed("v", kV, kv_heads, kRaggedV, "ragged_v");
    auto opts = fe::graph::SDPA_attributes()
                    .set_name("prefill")
                    .set_generate_stats(false)
                    .set_attn_scale(1.0f / std::sqrt(static_cast<float>(d)))
                    .set_causal_mask(true);
    if (ragged)
      opts.set_padding_mask(true)
          .set_seq_len_q(int_vec("seq_len_q", kSeqLen, b))
          .set_seq_len_kv(int_vec("seq_len_kv", kSeqLenKv, b));
    auto outputs = g->sdpa(q, k, v, opts);
    outputs[0]->set_output(true).set_uid(kO).set_dim({b, heads, s, d}).set_stride({s * heads * d, d, heads * d, 1});
    if (ragged) outputs[0]->set_ragged_offset(int_vec("ragged_o", kRaggedO, b + 1));
    Plan p;
    // The first step that fails says why (kept for prefill_attention()'s report).
    const auto failed = [&](const char* step, fe::error_t e) {
      if (e.is_good()) return false;
      refusal = std::string(step) + " for " + std::to_string(b) + " sequence(s) of " + (ragged ? "≤ " : "") +
                std::to_string(s) + " rows: " + e.get_message();
      return true;
    };
    if (failed("validate", g->validate()) || failed("build_operation_graph", g->build_operation_graph(handle)) ||
        failed("create_execution_plans", g->create_execution_plans({fe::HeurMode_t::A})) ||
        failed("check_support", g->check_support(handle)) || failed("build_plans", g->build_plans(handle)) ||
        failed("get_workspace_size", g->get_workspace_size(p.workspace)))
      return p;
    p.graph = std::move(g);
    return p;
  }
};

CudnnAttention::CudnnAttention(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudnnAttention::~CudnnAttention() = default;

std::unique_ptr<CudnnAttention> CudnnAttention::create(std::int64_t heads, std::int64_t kv_heads,
                                                       std::int64_t head_dim, std::string* why) {
  auto fail = [&](std::string reason) -> std::unique_ptr<CudnnAttention> {
    if (why) *why = std::move(reason);
    return nullptr;
  };
  if (head_dim > 128 || head_dim % 8 != 0 || heads % kv_heads != 0)
    return fail("head_dim " + std::to_string(head_dim) + " (cuDNN's prefill here: a multiple of 8 up to 128)");
  auto impl = std::make_unique<Impl>();
  impl->heads = heads;
  impl->kv_heads = kv_heads;
  impl->d = head_dim;
  const cudnnStatus_t st = cudnnCreate(&impl->handle);
  if (st != CUDNN_STATUS_SUCCESS) {
    impl->handle = nullptr;
    return fail(std::string("cudnnCreate: ") + cudnnGetErrorString(st));
  }
  return std::unique_ptr<CudnnAttention>(new CudnnAttention(std::move(impl)));
}

std::int64_t CudnnAttention::padded_rows(std::int64_t longest) { return bucket(longest, 64); }

bool CudnnAttention::wanted(std::span<const std::int64_t> row0, std::span<const std::int64_t> len, int build_at,
                            bool build_now) {
  Impl& m = *impl_;
  const Key key = shape_of(row0, len, (m.heads + 2 * m.kv_heads) * m.d).key;
  if (std::get<1>(key) == 0) return false;
  if (m.plans.count(key) != 0) return true;  // built (or refused: run() says so and the caller falls back)
  return build_now || ++m.seen[key] >= build_at;
}

std::int64_t CudnnAttention::graphs() const { return static_cast<std::int64_t>(impl_->plans.size()); }

std::string CudnnAttention::version() const { return std::to_string(cudnnGetVersion()); }

std::string CudnnAttention::refusal() const { return impl_->refusal; }

bool CudnnAttention::run(const __nv_bfloat16* qkv, std::span<const std::int64_t> row0,
                         std::span<const std::int64_t> len, __nv_bfloat16* out, cudaStream_t stream) {
  Impl& m = *impl_;
  const auto n = static_cast<std::int64_t>(row0.size());
  const std::int64_t row = (m.heads + 2 * m.kv_heads) * m.d;
  const auto [key, last_row] = shape_of(row0, len, row);
  const auto [b, s, ragged] = key;
  if (s == 0) return false;
  const bool uniform = !ragged;
  auto it = m.plans.find(key);
  if (it == m.plans.end()) {
    it = m.plans.emplace(key, m.build(b, s, ragged)).first;
    m.seen.erase(key);
  }
  const Impl::Plan& plan = it->second;
  if (!plan.graph) return false;
  if (m.workspace.size() < static_cast<std::size_t>(plan.workspace))
    m.workspace.resize(static_cast<std::size_t>(plan.workspace));
  auto* base = const_cast<__nv_bfloat16*>(qkv);  // cuDNN's variant pack takes void*; it only reads q, k, v
  TWELL_CHECK(cudnnSetStream(m.handle, stream) == CUDNN_STATUS_SUCCESS, ErrorCode::cuda, "cudnnSetStream failed");
  if (uniform) {
    std::unordered_map<fe::graph::Tensor_attributes::uid_t, void*> pack = {
        {kQ, base}, {kK, base + m.heads * m.d}, {kV, base + (m.heads + m.kv_heads) * m.d}, {kO, out}};
    auto e = plan.graph->execute(m.handle, pack, m.workspace.get());
    TWELL_CHECK(e.is_good(), ErrorCode::cuda, "cuDNN attention: {}", e.get_message());
    return true;
  }
  // seq_len [b], ragged_qkv [b + 1], ragged_o [b + 1] (the last offsets: the end of the rows).
  m.host.assign(static_cast<std::size_t>(3 * b + 2), 0);
  std::int32_t* sl = m.host.data();
  std::int32_t* rq = sl + b;
  std::int32_t* ro = rq + b + 1;
  for (std::int64_t i = 0; i <= b; ++i) {
    const std::int64_t r = i < n ? row0[static_cast<std::size_t>(i)] : last_row;
    if (i < b) sl[i] = static_cast<std::int32_t>(len[static_cast<std::size_t>(i)]);
    rq[i] = static_cast<std::int32_t>(r * row);
    ro[i] = static_cast<std::int32_t>(r * m.heads * m.d);
  }
  if (m.seq_len.size() < static_cast<std::size_t>(b)) m.seq_len.resize(static_cast<std::size_t>(b));
  if (m.ragged_qkv.size() < static_cast<std::size_t>(b + 1)) m.ragged_qkv.resize(static_cast<std::size_t>(b + 1));
  if (m.ragged_o.size() < static_cast<std::size_t>(b + 1)) m.ragged_o.resize(static_cast<std::size_t>(b + 1));
  // The layers of one forward share the arrays: copied when they change (stream order keeps an
  // earlier layer's reads before a later call's copy).
  if (m.host != m.uploaded || m.seq_len.get() != m.uploaded_to) {
    TWELL_CUDA_CHECK(cudaMemcpyAsync(m.seq_len.get(), sl, static_cast<std::size_t>(b) * 4, cudaMemcpyHostToDevice, stream));
    TWELL_CUDA_CHECK(
        cudaMemcpyAsync(m.ragged_qkv.get(), rq, static_cast<std::size_t>(b + 1) * 4, cudaMemcpyHostToDevice, stream));
    TWELL_CUDA_CHECK(
        cudaMemcpyAsync(m.ragged_o.get(), ro, static_cast<std::size_t>(b + 1) * 4, cudaMemcpyHostToDevice, stream));
    m.uploaded = m.host;
    m.uploaded_to = m.seq_len.get();
  }
  std::unordered_map<fe::graph::Tensor_attributes::uid_t, void*> pack = {
      {kQ, base},
      {kK, base + m.heads * m.d},
      {kV, base + (m.heads + m.kv_heads) * m.d},
      {kO, out},
      {kSeqLen, m.seq_len.get()},
      {kSeqLenKv, m.seq_len.get()},
      {kRaggedQ, m.ragged_qkv.get()},
      {kRaggedK, m.ragged_qkv.get()},
      {kRaggedV, m.ragged_qkv.get()},
      {kRaggedO, m.ragged_o.get()}};
  auto e = plan.graph->execute(m.handle, pack, m.workspace.get());
  TWELL_CHECK(e.is_good(), ErrorCode::cuda, "cuDNN attention: {}", e.get_message());
  return true;
}

}  // namespace twell::model
