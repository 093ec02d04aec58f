// RuntimeTuning: TWELL_TUNING's items, parsed and described from one table.
#include "twell/model/tuning.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <type_traits>
#include <variant>

#include <fmt/format.h>

#include "twell/error.hpp"

namespace twell::model {
namespace {

using Field = std::variant<bool RuntimeTuning::*, int RuntimeTuning::*, std::int64_t RuntimeTuning::*,
                           double RuntimeTuning::*>;

// A setting's values past its range check (null: every value in [lo, hi]), and what the refusal
// says the setting takes.
struct Rule {
  bool (*ok)(double) = nullptr;
  std::string_view takes;
};
// One row is the one-token kernels' (FfnLayer::set_union_min_rows refuses it).
constexpr Rule kUnionMinRows{[](double x) { return x != 1; },
                             "0 or an integer from 2 to 64, one row being the one-token kernels'"};
// A cluster's CTAs: a power of two up to the portable cluster size.
constexpr Rule kClusterSplit{[](double x) { return x == 1 || x == 2 || x == 4 || x == 8; }, "1, 2, 4 or 8"};

// One TWELL_TUNING item: a switch (a bool field; the item turns it off) or a setting (a number in
// [lo, hi], and its rule's if it has one). In RuntimeTuning's field order, which describe() keeps.
struct Item {
  std::string_view name;
  Field field;
  double lo = 0, hi = 0;
  Rule rule{};
};

// The ranges are those of the command-line flags these items replace.
const Item kItems[] = {
    {"no-cuda-graphs", &RuntimeTuning::cuda_graphs},
    {"no-cudnn-attention", &RuntimeTuning::cudnn_attention},
    {"cudnn-build-at", &RuntimeTuning::cudnn_build_at, 1, 1 << 20},
    {"no-pdl", &RuntimeTuning::programmatic_launch},
    {"smem-carveout", &RuntimeTuning::smem_carveout, 0, 100},
    {"no-fused-decode", &RuntimeTuning::fused_decode},
    {"no-fixed-point-decode", &RuntimeTuning::fixed_point_decode},
    {"no-decode-neuron-order", &RuntimeTuning::decode_neuron_order},
    {"dense-fold-norm", &RuntimeTuning::dense_fold_norm, 0, 1},
    {"no-batched-gemv", &RuntimeTuning::batched_gemv},
    {"no-grouped-attention", &RuntimeTuning::grouped_attention},
    {"grouped-attention-min-rows", &RuntimeTuning::grouped_attention_min_rows, 1, 65536},
    {"decode-max-density", &RuntimeTuning::decode_max_density, 0, 1},
    {"decode-max-rows", &RuntimeTuning::decode_max_rows, 1, 2047},
    {"decode-gemv-max-rows", &RuntimeTuning::decode_gemv_max_rows, 1, 16},
    {"union-max-rows", &RuntimeTuning::union_max_rows, 0, 64},
    {"union-min-rows", &RuntimeTuning::union_min_rows, 0, 64, kUnionMinRows},
    {"union-up-split", &RuntimeTuning::union_up_split, 1, 8, kClusterSplit},
    {"union-down-split", &RuntimeTuning::union_down_split, 1, 8, kClusterSplit},
    {"union-up-clusters", &RuntimeTuning::union_up_clusters, 0, 1024},
    {"no-cpu-bf16", &RuntimeTuning::cpu_bf16_weights},
    {"no-paged-kv", &RuntimeTuning::paged_kv},
    {"no-prefix-cache", &RuntimeTuning::prefix_cache},
    {"gemm-autotune", &RuntimeTuning::gemm_autotune, 2, 16},
};

template <typename T>
using FieldType = std::remove_cvref_t<decltype(std::declval<RuntimeTuning&>().*std::declval<T>())>;

// "no-cuda-graphs, ..., cudnn-build-at=N (1 to 1048576), ...", for errors.
std::string valid_items() {
  std::string s;
  for (const Item& it : kItems) {
    if (!s.empty()) s += ", ";
    s += it.name;
    std::visit(
        [&](auto field) {
          using T = FieldType<decltype(field)>;
          if constexpr (std::is_same_v<T, double>)
            s += fmt::format("=X ({} to {})", it.lo, it.hi);
          else if constexpr (!std::is_same_v<T, bool>)
            s += fmt::format("=N ({} to {})", it.lo, it.hi);
        },
        it.field);
  }
  return s;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

void apply(RuntimeTuning& t, std::string_view item) {
  const std::size_t eq = item.find('=');
  const std::string_view name = trim(item.substr(0, eq));
  const Item* found = nullptr;
  for (const Item& it : kItems)
    if (it.name == name) found = &it;
  if (!found) fail(ErrorCode::invalid_argument, "TWELL_TUNING: unknown item '{}' (the items: {})", item, valid_items());
  std::visit(
      [&](auto field) {
        using T = FieldType<decltype(field)>;
        if constexpr (std::is_same_v<T, bool>) {
          TWELL_CHECK(eq == std::string_view::npos, ErrorCode::invalid_argument,
                      "TWELL_TUNING: item '{}': {} is a switch and takes no value (the items: {})", item, name,
                      valid_items());
          t.*field = false;
        } else {
          const std::string_view v = eq == std::string_view::npos ? std::string_view() : trim(item.substr(eq + 1));
          T x{};
          const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
          const bool ok = !v.empty() && ec == std::errc() && end == v.data() + v.size() &&
                          static_cast<double>(x) >= found->lo && static_cast<double>(x) <= found->hi;  // NaN fails
          TWELL_CHECK(ok, ErrorCode::invalid_argument, "TWELL_TUNING: item '{}': {} takes {} from {} to {} (the items: {})",
                      item, name, std::is_same_v<T, double> ? "a number" : "an integer", found->lo, found->hi,
                      valid_items());
          TWELL_CHECK(!found->rule.ok || found->rule.ok(static_cast<double>(x)), ErrorCode::invalid_argument,
                      "TWELL_TUNING: item '{}': {} takes {} (the items: {})", item, name, found->rule.takes, valid_items());
          t.*field = x;
        }
      },
      found->field);
}

}  // namespace

RuntimeTuning parse_tuning(std::string_view items) {
  RuntimeTuning t;
  while (!items.empty()) {
    const std::size_t comma = items.find(',');
    const std::string_view item = trim(items.substr(0, comma));
    items = comma == std::string_view::npos ? std::string_view() : items.substr(comma + 1);
    if (!item.empty()) apply(t, item);
  }
  return t;
}

std::string RuntimeTuning::describe() const {
  const RuntimeTuning defaults;
  std::string s;
  for (const Item& it : kItems)
    std::visit(
        [&](auto field) {
          using T = FieldType<decltype(field)>;
          const T v = this->*field, d = defaults.*field;
          // A setting whose default is < 0 ("the engine's default") takes every negative value so.
          if constexpr (std::is_same_v<T, bool>) {
            if (v == d) return;
          } else {
            if (v == d || (d < 0 && v < 0)) return;
          }
          if (!s.empty()) s += ',';
          if constexpr (std::is_same_v<T, bool>)
            s += it.name;
          else
            s += fmt::format("{}={}", it.name, v);  // the shortest form that reads back as v
        },
        it.field);
  return s;
}

const RuntimeTuning& RuntimeTuning::from_env() {
  // A throwing initializer leaves the static uninitialized: the next call parses (and throws) again.
  static const RuntimeTuning tuning = [] {
    const char* env = std::getenv("TWELL_TUNING");
    if (!env) return RuntimeTuning{};
    const RuntimeTuning t = parse_tuning(env);
    const std::string d = t.describe();
    std::fprintf(stderr, "twell: TWELL_TUNING: %s\n", d.empty() ? "every switch at its default" : d.c_str());
    return t;
  }();
  return tuning;
}

}  // namespace twell::model
