// twell ffn: one FFN op on tensors from a safetensors file, results to a safetensors file.
#include <memory>

#include "common.hpp"
#include "twell/cpu/ffn_ops.hpp"
#include "twell/io/safetensors.hpp"
#if defined(TWELL_HAVE_CUDA)
#include "twell/cuda/ffn_cuda.hpp"
#endif

namespace twell::cli {
namespace {

struct FfnArgs {
  std::string op;
  std::string in, out;
  std::string device;
  bool no_gate = false;
  FormatFlags fmt;
};

int run_ffn(const FfnArgs& a) {
  // Options first, so a typo fails before any reading or computing.
  const TwellConfig tcfg = a.fmt.twell();
  const HybridConfig hcfg = a.fmt.hybrid();
  std::string why;
  const DeviceKind dev = resolve_device(a.device, &why);
  DeviceKind run_dev = dev;
  check_writable(a.out, "--out");

  LoadRules rules;
  rules.gated = !a.no_gate;
  rules.need_dy = a.op == "train";
  const FfnInputs in = load_ffn_inputs(a.in, rules);
  const FfnWeights w = in.weights();
  ffn_check_shapes(in.x_view(), w);

  const double t0 = now_seconds();
  HostTensor y(DType::f32, {in.m, in.k});
  MatrixF yv(y.data<float>(), in.m, in.k);
  std::vector<std::pair<std::string, HostTensor>> outputs;
  std::string detail;

  // Training outputs, filled by whichever device runs the step.
  HostTensor dx, dwu, dwd, dwg;
  FfnGrads g;
  FfnTrainScalars scalars;
  if (a.op == "train") {
    dx = HostTensor(DType::f32, {in.m, in.k});
    dwu = HostTensor(DType::f32, {in.n, in.k});
    dwd = HostTensor(DType::f32, {in.k, in.n});
    if (in.gated) dwg = HostTensor(DType::f32, {in.n, in.k});
    g.dx = MatrixF(dx.data<float>(), in.m, in.k);
    if (in.gated) g.dw_gate = MatrixF(dwg.data<float>(), in.n, in.k);
    g.dw_up = MatrixF(dwu.data<float>(), in.n, in.k);
    g.dw_down = MatrixF(dwd.data<float>(), in.k, in.n);
  }
  const double l1_coeff = in.l1_coeff.value_or(0.0);
  // A request the CUDA path cannot serve (a shape or tile it does not implement): with
  // --device cuda that is the answer; with the automatic choice the CPU serves it instead.
  [[maybe_unused]] auto fall_back_to_cpu = [&](const Error& e) {
    if (e.code() != ErrorCode::unsupported) throw e;
    if (a.device == "cuda") fail(ErrorCode::unsupported, "--device cuda: {} (--device cpu runs it)", e.what());
    why = fmt::format("the cuda path cannot run this: {}", e.what());
    run_dev = DeviceKind::cpu;
  };

  if (run_dev == DeviceKind::cuda && a.op == "train") {
#if defined(TWELL_HAVE_CUDA)
    try {
      const cuda::TrainReport rep = cuda::ffn_train_host(in.x_view(), in.dy_view(), w, l1_coeff, yv, g);
      scalars = rep.scalars;
      detail = fmt::format("path {}, l1 {:.6g}, l0 {:.2f}, l1_coeff {:g}, {:.1f} MB saved for backward", rep.path,
                           scalars.l1, scalars.l0, l1_coeff, static_cast<double>(rep.saved_bytes) / (1 << 20));
    } catch (const Error& e) {
      fall_back_to_cpu(e);
    }
#endif
  } else if (run_dev == DeviceKind::cuda) {
#if defined(TWELL_HAVE_CUDA)
    cuda::InferenceOptions opt;
    opt.twell = tcfg;
    opt.path = a.op == "dense" ? cuda::Path::dense : cuda::Path::sparse;
    try {
      const cuda::InferenceReport rep = cuda::ffn_infer_host(in.x_view(), w, yv, opt);
      detail = a.op == "dense" ? fmt::format("path {}", rep.path)
                               : fmt::format("path {}, {} active neurons, {} overflow rows", rep.path, rep.nnz,
                                             rep.overflow_rows);
    } catch (const Error& e) {
      fall_back_to_cpu(e);
    }
#endif
  }
  if (run_dev == DeviceKind::cuda) {
    // done above
  } else if (a.op == "dense") {
    cpu::ffn_dense(in.x_view(), w, yv);
  } else if (a.op == "sparse") {
    const cpu::PreparedFfn prep = cpu::prepare_ffn(w);
    const cpu::SparseInferenceInfo info = cpu::ffn_sparse(in.x_view(), prep, yv, tcfg);
    detail = fmt::format("{:.1f} active neurons per row, {} overflow rows", info.stats.mean_row_nnz,
                         info.stats.overflow_rows);
  } else {  // train on the CPU
    const cpu::PreparedFfn prep = cpu::prepare_ffn(w);
    const cpu::TrainState state = cpu::ffn_train_forward(in.x_view(), prep, yv, hcfg);
    cpu::ffn_train_backward(in.x_view(), in.dy_view(), prep, state, l1_coeff, g);
    scalars = state.scalars;
    detail = fmt::format("l1 {:.6g}, l0 {:.2f}, l1_coeff {:g}, {} rows over E={}", state.scalars.l1,
                         state.scalars.l0, l1_coeff, state.p.tail_count(), hcfg.ell_width);
  }
  if (a.op == "train") {
    outputs.emplace_back("dx", std::move(dx));
    if (in.gated) outputs.emplace_back("dw_gate", std::move(dwg));
    outputs.emplace_back("dw_up", std::move(dwu));
    outputs.emplace_back("dw_down", std::move(dwd));
    outputs.emplace_back("l1", io::scalar_f32(static_cast<float>(scalars.l1)));
    outputs.emplace_back("l0", io::scalar_f32(static_cast<float>(scalars.l0)));
  }
  const double secs = now_seconds() - t0;
  // Never write a result with NaN/Inf in it: the inputs were finite, so that would be a bug.
  check_finite("y", y);
  for (const auto& [name, t] : outputs) check_finite(name, t);

  std::vector<io::TensorRef> refs{{"y", &y}};
  for (const auto& [name, t] : outputs) refs.push_back({name, &t});
  io::write_safetensors(a.out, refs,
                        {{"producer", "twell ffn"}, {"op", a.op}, {"device", to_string(run_dev)},
                         {"gated", in.gated ? "true" : "false"}, {"commit", git_commit()}});

  std::string where = run_dev == DeviceKind::cuda ? fmt::format("cuda ({})", why)
                                                  : fmt::format("cpu ({} threads; {})", host_threads(), why);
  note(fmt::format("ffn {} {} M={} K={} N={} ran on {} in {:.3f} s{}{}", a.op, in.gated ? "gated" : "non-gated", in.m,
                   in.k, in.n, where, secs, detail.empty() ? "" : ": ", detail));
  return 0;
}

}  // namespace

void add_ffn_command(CLI::App& root, std::vector<Command>& out) {
  auto a = std::make_shared<FfnArgs>();
  CLI::App* sub = root.add_subcommand("ffn", "Run one FFN op (dense, sparse, train) on tensors from a safetensors file");
  sub->footer("Run one FFN op on tensors from a safetensors file and write the results to a safetensors file.\n"
      "Inputs (bf16 or fp32, Hugging Face layouts): x [M,K], w_gate [N,K] (absent with --no-gate),\n"
      "w_up [N,K], w_down [K,N]; for --op train also dy [M,K] and optional scalar l1_coeff (default 0).\n"
      "Outputs (fp32): y [M,K]; for train also dx, dw_gate (gated only), dw_up, dw_down, l1, l0, the\n"
      "gradients of <y, dy> + l1_coeff * l1 with l1 = sum|h| / M and l0 = active neurons / M.\n"
      "Gated: y = (ReLU(x w_gate^T) * (x w_up^T)) w_down^T. Non-gated: y = ReLU(x w_up^T) w_down^T.\n"
      "Precision: on the cpu, dense and train are fp32 throughout and sparse stores the ReLU activations as\n"
      "bf16 in TwELL (relative error ~1e-3); on cuda, operands are bf16 (relative error ~1e-2).");
  sub->add_option("--op", a->op, "dense (BLAS baseline), sparse (TwELL inference) or train (hybrid forward+backward)")
      ->required()
      ->check(CLI::IsMember({"dense", "sparse", "train"}));
  sub->add_option("--in", a->in, "Input safetensors file")->required();
  sub->add_option("--out", a->out, "Output safetensors file (written atomically)")->required();
  sub->add_option("--device", a->device, "cpu or cuda (default: cuda when a GPU is usable, else cpu)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_flag("--no-gate", a->no_gate, "Non-gated FFN: y = ReLU(x w_up^T) w_down^T; the file must not hold w_gate");
  a->fmt.add(sub);
  out.push_back({sub, [a] { return run_ffn(*a); }});
}

}  // namespace twell::cli
