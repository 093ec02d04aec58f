// RuntimeTuning: TWELL_TUNING's items parsed (parse_tuning, which from_env uses; from_env itself
// reads the environment once per process, so the cases here go through parse_tuning) and described.
#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "twell/error.hpp"
#include "twell/model/tuning.hpp"

namespace {

using twell::Error;
using twell::ErrorCode;
using twell::model::parse_tuning;
using twell::model::RuntimeTuning;

// The error parse_tuning throws for `items` (an empty message if it throws none).
std::string refusal(std::string_view items) {
  try {
    parse_tuning(items);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument) << items;
    return e.what();
  }
  ADD_FAILURE() << "accepted: " << items;
  return "";
}

TEST(RuntimeTuning, DefaultsDescribeAsNothing) {
  EXPECT_EQ(RuntimeTuning{}.describe(), "");
  EXPECT_EQ(parse_tuning(""), RuntimeTuning{});
  EXPECT_EQ(parse_tuning(" , ,"), RuntimeTuning{});  // empty items are ignored
}

TEST(RuntimeTuning, EveryItemParses) {
  const RuntimeTuning t = parse_tuning(
      "no-cuda-graphs,no-cudnn-attention,cudnn-build-at=1,decode-max-rows=8,decode-gemv-max-rows=12,union-max-rows=0,"
      "union-min-rows=8,union-up-split=4,union-down-split=2,union-up-clusters=16,decode-max-density=0.02,no-pdl,"
      "smem-carveout=100,no-fused-decode,no-fixed-point-decode,no-decode-neuron-order,dense-fold-norm=1,no-batched-gemv,"
      "no-grouped-attention,grouped-attention-min-rows=8,no-cpu-bf16,"
      "no-paged-kv,no-prefix-cache,gemm-autotune=8");
  EXPECT_FALSE(t.cuda_graphs);
  EXPECT_FALSE(t.cudnn_attention);
  EXPECT_EQ(t.cudnn_build_at, 1);
  EXPECT_FALSE(t.programmatic_launch);
  EXPECT_EQ(t.smem_carveout, 100);
  EXPECT_FALSE(t.fused_decode);
  EXPECT_FALSE(t.fixed_point_decode);
  EXPECT_FALSE(t.decode_neuron_order);
  EXPECT_EQ(t.dense_fold_norm, 1);
  EXPECT_FALSE(t.batched_gemv);
  EXPECT_FALSE(t.grouped_attention);
  EXPECT_EQ(t.grouped_attention_min_rows, 8);
  EXPECT_EQ(t.decode_max_density, 0.02);
  EXPECT_EQ(t.decode_max_rows, 8);
  EXPECT_EQ(t.decode_gemv_max_rows, 12);
  EXPECT_EQ(t.union_max_rows, 0);
  EXPECT_EQ(t.union_min_rows, 8);
  EXPECT_EQ(t.union_up_split, 4);
  EXPECT_EQ(t.union_down_split, 2);
  EXPECT_EQ(t.union_up_clusters, 16);
  EXPECT_FALSE(t.cpu_bf16_weights);
  EXPECT_FALSE(t.paged_kv);
  EXPECT_FALSE(t.prefix_cache);
  EXPECT_EQ(t.gemm_autotune, 8);
  // describe(): every non-default setting, in the struct's order, read back to the same value.
  EXPECT_EQ(t.describe(),
            "no-cuda-graphs,no-cudnn-attention,cudnn-build-at=1,no-pdl,smem-carveout=100,no-fused-decode,no-fixed-point-decode,"
            "no-decode-neuron-order,dense-fold-norm=1,no-batched-gemv,no-grouped-attention,grouped-attention-min-rows=8,"
            "decode-max-density=0.02,decode-max-rows=8,"
            "decode-gemv-max-rows=12,union-max-rows=0,union-min-rows=8,union-up-split=4,union-down-split=2,union-up-clusters=16,no-cpu-bf16,"
            "no-paged-kv,no-prefix-cache,gemm-autotune=8");
  EXPECT_EQ(parse_tuning(t.describe()), t);
}

TEST(RuntimeTuning, OneItemChangesOneSetting) {
  RuntimeTuning want;
  want.cudnn_attention = false;
  EXPECT_EQ(parse_tuning("no-cudnn-attention"), want);
  EXPECT_EQ(parse_tuning("  no-cudnn-attention , "), want);  // blanks around items
  EXPECT_EQ(want.describe(), "no-cudnn-attention");
  // A later item overrides an earlier one.
  EXPECT_EQ(parse_tuning("decode-max-rows=4,decode-max-rows=64").decode_max_rows, 64);
  // The range's ends are in it.
  EXPECT_EQ(parse_tuning("decode-max-density=0").decode_max_density, 0.0);
  EXPECT_EQ(parse_tuning("decode-max-density=1").decode_max_density, 1.0);
  EXPECT_EQ(parse_tuning("decode-max-rows=2047").decode_max_rows, 2047);
  EXPECT_EQ(parse_tuning("decode-gemv-max-rows=1").decode_gemv_max_rows, 1);
  EXPECT_EQ(parse_tuning("decode-gemv-max-rows=16").decode_gemv_max_rows, 16);
  EXPECT_EQ(parse_tuning("union-max-rows=0").union_max_rows, 0);
  EXPECT_EQ(parse_tuning("union-max-rows=64").union_max_rows, 64);
  EXPECT_EQ(parse_tuning("union-min-rows=0").union_min_rows, 0);
  EXPECT_EQ(parse_tuning("union-min-rows=64").union_min_rows, 64);
  EXPECT_EQ(parse_tuning("union-up-split=1").union_up_split, 1);
  EXPECT_EQ(parse_tuning("union-down-split=8").union_down_split, 8);
  EXPECT_EQ(parse_tuning("union-up-clusters=0").union_up_clusters, 0);
  EXPECT_EQ(parse_tuning("union-up-clusters=1024").union_up_clusters, 1024);
  EXPECT_EQ(parse_tuning("cudnn-build-at=1048576").cudnn_build_at, 1 << 20);
  EXPECT_EQ(parse_tuning("gemm-autotune=2").gemm_autotune, 2);
  EXPECT_EQ(parse_tuning("gemm-autotune=16").gemm_autotune, 16);
  EXPECT_EQ(parse_tuning("smem-carveout=0").smem_carveout, 0);
  EXPECT_EQ(parse_tuning("smem-carveout=100").smem_carveout, 100);
  // A negative decode setting is the engine's default, as the field says: nothing to describe.
  RuntimeTuning negative;
  negative.decode_max_rows = -5;
  negative.decode_max_density = -0.5;
  EXPECT_EQ(negative.describe(), "");
}

TEST(RuntimeTuning, UnknownItemIsRefusedByName) {
  for (const char* items : {"no-cuda-graph", "no-cuda-graphs,fast", "--no-pdl", "NO-PDL", "cuda-graphs"}) {
    const std::string e = refusal(items);
    EXPECT_NE(e.find("TWELL_TUNING: unknown item"), std::string::npos) << e;
    // The valid items are listed, settings with their ranges.
    EXPECT_NE(e.find("no-cuda-graphs, no-cudnn-attention, cudnn-build-at=N (1 to 1048576)"), std::string::npos) << e;
    EXPECT_NE(e.find("decode-max-rows=N (1 to 2047), decode-gemv-max-rows=N (1 to 16), union-max-rows=N (0 to 64), union-min-rows=N (0 to 64), "
                     "union-up-split=N (1 to 8), union-down-split=N (1 to 8), union-up-clusters=N (0 to 1024), no-cpu-bf16"),
              std::string::npos)
        << e;
  }
  EXPECT_NE(refusal("no-cuda-graphs,fast").find("'fast'"), std::string::npos);
  EXPECT_NE(refusal("no-cuda-graph").find("'no-cuda-graph'"), std::string::npos);
}

TEST(RuntimeTuning, MalformedValueIsRefusedByName) {
  struct Case {
    const char* items;
    const char* phrase;  // what the message must hold
  };
  for (const Case& c : {
           Case{"dense-fold-norm=2", "dense-fold-norm takes an integer from 0 to 1"},
           Case{"gemm-autotune=1", "gemm-autotune takes an integer from 2 to 16"},
           Case{"smem-carveout=101", "smem-carveout takes an integer from 0 to 100"},
           Case{"smem-carveout=-1", "smem-carveout takes an integer from 0 to 100"},
           Case{"gemm-autotune=17", "gemm-autotune takes an integer from 2 to 16"},
           Case{"gemm-autotune", "gemm-autotune takes an integer"},
           Case{"decode-max-rows=abc", "item 'decode-max-rows=abc': decode-max-rows takes an integer from 1 to 2047"},
           Case{"decode-max-rows=0", "decode-max-rows takes an integer from 1 to 2047"},
           Case{"decode-max-rows=2048", "decode-max-rows takes an integer from 1 to 2047"},
           Case{"decode-gemv-max-rows=0", "decode-gemv-max-rows takes an integer from 1 to 16"},
           Case{"decode-gemv-max-rows=17", "decode-gemv-max-rows takes an integer from 1 to 16"},
           Case{"union-max-rows=65", "union-max-rows takes an integer from 0 to 64"},
           Case{"grouped-attention-min-rows=0", "grouped-attention-min-rows takes an integer from 1 to 65536"},
           Case{"union-min-rows=65", "union-min-rows takes an integer from 0 to 64"},
           Case{"union-min-rows=1", "union-min-rows takes 0 or an integer from 2 to 64"},
           Case{"union-up-split=3", "item 'union-up-split=3': union-up-split takes 1, 2, 4 or 8"},
           Case{"union-down-split=6", "union-down-split takes 1, 2, 4 or 8"},
           Case{"union-down-split=16", "union-down-split takes an integer from 1 to 8"},
           Case{"union-up-clusters=-1", "union-up-clusters takes an integer from 0 to 1024"},
           Case{"decode-max-rows=8.5", "decode-max-rows takes an integer"},
           Case{"decode-max-rows=", "decode-max-rows takes an integer"},
           Case{"decode-max-rows", "decode-max-rows takes an integer"},  // a setting needs its value
           Case{"decode-max-density=0.02x", "item 'decode-max-density=0.02x': decode-max-density takes a number from 0 to 1"},
           Case{"decode-max-density=1.5", "decode-max-density takes a number from 0 to 1"},
           Case{"decode-max-density=-0.1", "decode-max-density takes a number"},
           Case{"decode-max-density=nan", "decode-max-density takes a number"},
           Case{"cudnn-build-at=0", "cudnn-build-at takes an integer from 1 to 1048576"},
           Case{"cudnn-build-at=99999999999", "cudnn-build-at takes an integer"},  // past int
           Case{"no-pdl=1", "item 'no-pdl=1': no-pdl is a switch and takes no value"},
       }) {
    const std::string e = refusal(c.items);
    EXPECT_NE(e.find(c.phrase), std::string::npos) << c.items << ": " << e;
    EXPECT_NE(e.find("(the items: no-cuda-graphs,"), std::string::npos) << c.items << ": " << e;
  }
}

}  // namespace
