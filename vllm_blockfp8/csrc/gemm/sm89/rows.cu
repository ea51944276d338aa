// The SM89 rows' kernels (kernel.cuh), instantiated once per row of table.h and output type in this one unit (CI
// compiles on 2 cores: one unit, 6 kernels plus 2 sum kernels), and launch_row(), the launcher plan.cpp calls.
// Arch: compiled for sm_89 and sm_90a (setup.py's "also_for"); ptxas must report 0 spill bytes for every kernel
// (.ci/run checks the unit's log).
#include <cuda_runtime.h>

#include <algorithm>

#include "kernel.cuh"
#include "table.h"

namespace blockfp8::gemm::sm89 {
namespace {

template <int R, typename OutT>
cudaError_t launch_typed(const Problem& p, const Launch& l, cudaStream_t s) {
  constexpr Kernel c = kRows[R].kernel;
  auto* kernel = &gemm_kernel<c.bm, c.bn, c.warps_m, c.warps_n, c.stages, OutT>;
  // Above 48 KB of dynamic shared memory needs the opt-in; a host-side attribute, so a graph capture may set it.
  if (const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, c.smem_bytes());
      e != cudaSuccess)
    return e;
  const int64_t tiles = ((p.m + c.bm - 1) / c.bm) * ((p.n + c.bn - 1) / c.bn);
  const int64_t kblocks = p.k / kBlockK;
  Params a{};
  a.a = static_cast<const uint8_t*>(p.a);
  a.a_scale = p.a_scale;
  a.a_scale_ld = p.a_scale_ld;
  a.b = static_cast<const uint8_t*>(p.b);
  a.b_scale = p.b_scale;
  a.d = p.d;
  a.partials = static_cast<float*>(p.workspace);
  a.m = int(p.m), a.n = int(p.n), a.k = int(p.k);
  a.group_m = l.group_m;
  a.per_slice = int((kblocks + l.slices - 1) / l.slices);
  kernel<<<dim3(unsigned(tiles), 1, unsigned(l.slices)), c.threads(), c.smem_bytes(), s>>>(a);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess || l.slices == 1) return e;
  const int64_t elements = p.m * p.n;
  const int blocks = int(std::min<int64_t>((elements + 255) / 256, int64_t(p.sm_count) * 8));
  sum_slices_kernel<OutT><<<blocks, 256, 0, s>>>(a.partials, static_cast<OutT*>(p.d), elements, l.slices);
  return cudaGetLastError();
}

template <int R>
cudaError_t launch_row_of(const Problem& p, const Launch& l, cudaStream_t s) {
  return p.out_bf16 ? launch_typed<R, __nv_bfloat16>(p, l, s) : launch_typed<R, __half>(p, l, s);
}

}  // namespace

cudaError_t launch_row(const Problem& p, const Launch& l, cudaStream_t s) {
  switch (l.row) {
    case kTok32: return launch_row_of<kTok32>(p, l, s);
    case kTok64: return launch_row_of<kTok64>(p, l, s);
    case kTok128: return launch_row_of<kTok128>(p, l, s);
    default: return cudaErrorInvalidValue;
  }
}
static_assert(kNumRows == 3, "launch_row() has one case per row");

}  // namespace blockfp8::gemm::sm89
