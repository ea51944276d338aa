// SM90 W8A8 GEMM: a plan to its row's kernel. Each `cutlass_kernel()` row of table.h runs the entry points its generated
// unit instantiates (kernels/config.h), each `tok64_kernel()` row kernels/tok64.cu. Host code; no CUTLASS here.
#include <array>
#include <utility>

#include "kernels/config.h"
#include "kernels/tok64.h"
#include "plan.h"

namespace blockfp8::gemm::sm90 {
namespace {

struct Entry {
  cudaError_t (*launch)(const Problem&, const Plan&, cudaStream_t);
  size_t (*workspace)(const Problem&, const Plan&);
};

size_t no_workspace(const Problem&, const Plan&) { return 0; }

template <int I>
constexpr Entry entry() {
  if constexpr (kRows[I].kernel.kind == KernelKind::kTok64) {
    return {&tok64::launch, &no_workspace};
  } else {
    return {&launch_config<RowConfig<I>>, &workspace_config<RowConfig<I>>};
  }
}

template <int... I>
constexpr std::array<Entry, kNumRows> entries(std::integer_sequence<int, I...>) {
  return {entry<I>()...};
}
constexpr std::array<Entry, kNumRows> kEntries = entries(std::make_integer_sequence<int, kNumRows>{});

bool plans_a_row(const Problem& p, const Plan& plan) {
  return plan.row >= 0 && plan.row < kNumRows && p.m >= 1 && p.n >= 1 && p.k >= 128 && p.sm_count > 0;
}

}  // namespace
}  // namespace blockfp8::gemm::sm90

namespace blockfp8::gemm::sm90 {

// The arch API (../arch.h).

size_t workspace_bytes(const Problem& p, const Plan& plan) {
  // Only the sizes matter here (the caller sizes the buffer before filling the pointers).
  if (!sm90::plans_a_row(p, plan)) return 0;
  return sm90::kEntries[plan.row].workspace(p, plan);
}

cudaError_t launch(const Problem& p, const Plan& plan, cudaStream_t s) {
  if (plan.row < 0 || plan.row >= sm90::kNumRows || sm90::rejects(p) != nullptr) return cudaErrorInvalidValue;
  if (p.m == 0) return cudaSuccess;
  if (p.a == nullptr || p.b == nullptr || p.a_scale == nullptr || p.b_scale == nullptr || p.d == nullptr)
    return cudaErrorInvalidValue;
  return sm90::kEntries[plan.row].launch(p, plan, s);
}

}  // namespace blockfp8::gemm::sm90
