// SM120 W8A8 GEMM: a plan to its row's kernel. Each row of table.h runs the entry points its generated unit
// instantiates (kernels/config.h, kernels/cutlass_gemm.cuh). Host code; no CUTLASS here.
#include <array>
#include <utility>

#include "../arch.h"
#include "kernels/config.h"

namespace blockfp8::gemm::sm120 {
namespace {

struct Entry {
  cudaError_t (*launch)(const Problem&, const Plan&, cudaStream_t);
  size_t (*workspace)(const Problem&, const Plan&);
};

template <int... I>
constexpr std::array<Entry, kNumRows> entries(std::integer_sequence<int, I...>) {
  return {Entry{&launch_config<RowConfig<I>>, &workspace_config<RowConfig<I>>}...};
}
constexpr std::array<Entry, kNumRows> kEntries = entries(std::make_integer_sequence<int, kNumRows>{});

}  // namespace

size_t workspace_bytes(const Problem& p, const Plan& plan) {
  // Only the sizes matter here (the caller sizes the buffer before filling the pointers).
  if (plan.row < 0 || plan.row >= kNumRows || p.m < 1 || p.n < 1 || p.k < 128 || p.sm_count <= 0) return 0;
  return kEntries[plan.row].workspace(p, plan);
}

cudaError_t launch(const Problem& p, const Plan& plan, cudaStream_t s) {
  if (plan.row < 0 || plan.row >= kNumRows || sm120::rejects(p) != nullptr) return cudaErrorInvalidValue;
  if (p.m == 0) return cudaSuccess;
  if (p.a == nullptr || p.b == nullptr || p.a_scale == nullptr || p.b_scale == nullptr || p.d == nullptr)
    return cudaErrorInvalidValue;
  return kEntries[plan.row].launch(p, plan, s);
}

}  // namespace blockfp8::gemm::sm120
