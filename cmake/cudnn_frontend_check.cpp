// Configure-time check (src/model/CMakeLists.txt): cudnn-frontend's headers compile against this
// cuDNN's headers and link against its library, for the calls src/model/cudnn_attention.cpp makes.
// Built, never run.
#define CUDNN_FRONTEND_SKIP_JSON_LIB 1
#include <cudnn_frontend.h>

#include <unordered_map>

int main() {
  namespace fe = cudnn_frontend;
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto ints = [&](const char* name, std::int64_t uid, std::int64_t n) {
    return g->tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim({n, 1, 1, 1}).set_stride({1, 1, 1, 1}).set_data_type(fe::DataType_t::INT32));
  };
  auto t = [&](const char* name, std::int64_t uid, std::int64_t ragged_uid) {
    return g->tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim({1, 2, 64, 64}).set_stride({64 * 384, 64, 384, 1}).set_ragged_offset(ints("r", ragged_uid, 2)));
  };
  auto out = g->sdpa(t("q", 1, 11), t("k", 2, 12), t("v", 3, 13),
                     fe::graph::SDPA_attributes().set_name("p").set_generate_stats(false).set_attn_scale(0.125f)
                         .set_causal_mask(true).set_padding_mask(true).set_seq_len_q(ints("sq", 4, 1)).set_seq_len_kv(ints("skv", 5, 1)));
  out[0]->set_output(true).set_uid(6).set_dim({1, 2, 64, 64}).set_stride({64 * 128, 64, 128, 1}).set_ragged_offset(ints("ro", 14, 2));
  cudnnHandle_t h = nullptr;
  if (cudnnCreate(&h) != CUDNN_STATUS_SUCCESS) return 1;
  std::int64_t ws = 0;
  bool ok = g->validate().is_good() && g->build_operation_graph(h).is_good() &&
            g->create_execution_plans({fe::HeurMode_t::A}).is_good() && g->check_support(h).is_good() &&
            g->build_plans(h).is_good() && g->get_workspace_size(ws).is_good();
  std::unordered_map<fe::graph::Tensor_attributes::uid_t, void*> pack;
  ok = ok && g->execute(h, pack, nullptr).is_good();
  cudnnSetStream(h, nullptr);
  cudnnDestroy(h);
  return ok ? 0 : 2;
}
