// wgmma issue-rate probe for the SM90 GEMM rows (an H200 diagnostic; not part of the extension).
//
// Question (gemm/NOTES.md, "Tried and not kept"): the register-A 128x256 candidate ran 0.90 us a K block
// (~1650 cycles at 1.83 GHz) where the shared-memory model said 1024; per m64n64k32 wgmma ~52 cycles, as in the
// 128x64 swap row (~56), against 32 of tensor work (N / 2 cycles at 4096 FP8 MACs per clock and SM).
// Is a 64-wide wgmma slow by itself, or only when it waits on the one before it (a chain of K steps
// into one accumulator)? Each kernel here runs nothing but wgmma on fixed shared-memory tiles: per
// iteration and warpgroup, `Chains` independent accumulators of 64 x N each take 4 K steps of 32
// (one 128-deep K block), issued chain by chain (c0k0 c0k1 c0k2 c0k3 c1k0 ...) or interleaved
// (c0k0 c1k0 c0k1 ...), then one commit and a wait that leaves `Depth` batches in flight. A is read
// from shared memory (SS) or, for the RS variant, loaded to registers once before the loop.
// One CTA per SM (132 on the H200), `WGs` warpgroups each; printed: clock cycles per wgmma per SM
// (both warpgroups' wgmma counted) and that over the tensor work N / 2.
//
// Build and run (the H200 stage `wgmma_probe` of dev/device/h200_check.sh does this):
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
//        -I <nvidia-cutlass include> dev/probes/wgmma_rate_probe.cu -o probe && ./probe out.json
#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cute/tensor.hpp"
#include "cute/arch/mma_sm90.hpp"
#include "cute/atom/mma_traits_sm90_gmma.hpp"
#include "probe_util.cuh"

using namespace cute;
using Fp8 = cutlass::float_e4m3_t;

constexpr int kTileK = 128;

template <int N, bool RegisterA>
using ProbeMma = decltype(make_tiled_mma(
    std::conditional_t<RegisterA,
                       decltype(SM90::GMMA::rs_op_selector<Fp8, Fp8, float, Shape<_64, Int<N>, _32>>()),
                       decltype(SM90::GMMA::ss_op_selector<Fp8, Fp8, float, Shape<_64, Int<N>, _32>>())>{}));

template <int N, int Chains, bool Interleaved, bool RegisterA, int WGs, int Depth>
__global__ void __launch_bounds__(128 * WGs, 1) wgmma_probe(int iters, long long* cycles, float* sink) {
  // Per warpgroup its own 64 x 128 A tile, one N x 128 B tile for all (as a cooperative CTA).
  auto a_layout = tile_to_shape(GMMA::Layout_K_SW128_Atom<Fp8>{}, Shape<_64, Int<kTileK>>{});
  auto b_layout = tile_to_shape(GMMA::Layout_K_SW128_Atom<Fp8>{}, Shape<Int<N>, Int<kTileK>>{});
  extern __shared__ __align__(1024) uint8_t smem[];
  const int a_bytes = 64 * kTileK;
  // Small positive E4M3 values (no NaN/Inf patterns: bits 0x00..0x3f), varied so no path is special.
  for (int i = threadIdx.x; i < WGs * a_bytes + N * kTileK; i += blockDim.x) smem[i] = (i * 37 + 11) & 0x3f;
  __syncthreads();

  const int wg = threadIdx.x / 128;
  const int tid = threadIdx.x % 128;
  Tensor sA = make_tensor(make_smem_ptr(reinterpret_cast<Fp8*>(smem + wg * a_bytes)), a_layout);
  Tensor sB = make_tensor(make_smem_ptr(reinterpret_cast<Fp8*>(smem + WGs * a_bytes)), b_layout);

  ProbeMma<N, RegisterA> mma;
  auto thr = mma.get_thread_slice(tid);
  Tensor tCrB = thr.make_fragment_B(thr.partition_B(sB));  // (MMA, 1, 4) descriptors
  Tensor acc = partition_fragment_C(mma, Shape<_64, Int<N * Chains>>{});  // (MMA, 1, Chains)
  static_assert(decltype(size<2>(acc))::value == Chains);

  auto a_operand = [&]() {
    if constexpr (RegisterA) {
      Tensor r = thr.partition_fragment_A(sA);
      auto a_copy = make_tiled_copy_A(Copy_Atom<AutoVectorizingCopy, Fp8>{}, mma);
      copy(a_copy, a_copy.get_thread_slice(tid).partition_S(sA), a_copy.get_thread_slice(tid).retile_D(r));
      return r;
    } else {
      return thr.make_fragment_A(thr.partition_A(sA));
    }
  }();
  constexpr int kSteps = decltype(size<2>(tCrB))::value;
  static_assert(kSteps == kTileK / 32);

  clear(acc);
  warpgroup_fence_operand(acc);
  if constexpr (RegisterA) warpgroup_fence_operand(a_operand);
  __syncthreads();
  const long long t0 = clock64();
  mma.accumulate_ = GMMA::ScaleOut::One;
  for (int it = 0; it < iters; ++it) {
    warpgroup_arrive();
    if constexpr (Interleaved) {
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < kSteps; ++k) {
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < Chains; ++c) cute::gemm(mma, a_operand(_, 0, k), tCrB(_, 0, k), acc(_, 0, c));
      }
    } else {
      CUTLASS_PRAGMA_UNROLL
      for (int c = 0; c < Chains; ++c) {
        CUTLASS_PRAGMA_UNROLL
        for (int k = 0; k < kSteps; ++k) cute::gemm(mma, a_operand(_, 0, k), tCrB(_, 0, k), acc(_, 0, c));
      }
    }
    warpgroup_commit_batch();
    warpgroup_wait<Depth>();
  }
  warpgroup_wait<0>();
  warpgroup_fence_operand(acc);
  __syncthreads();
  const long long t1 = clock64();
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
  keep_live(sink, acc);
}

struct Result {
  std::string name;
  int n, chains, wgs;
  double cycles_per_wgmma, over_tensor;
};

template <int N, int Chains, bool Interleaved, bool RegisterA, int WGs, int Depth>
void run(std::vector<Result>& out, int sms, long long* cycles, float* sink) {
  auto kernel = wgmma_probe<N, Chains, Interleaved, RegisterA, WGs, Depth>;
  const int smem = WGs * 64 * kTileK + N * kTileK + 1024;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  const int iters = 2000;
  kernel<<<sms, 128 * WGs, smem>>>(50, cycles, sink);  // warm-up (clocks up)
  kernel<<<sms, 128 * WGs, smem>>>(iters, cycles, sink);
  cudaError_t err = cudaDeviceSynchronize();
  char name[96];
  snprintf(name, sizeof name, "%s n%d chains%d %s wg%d depth%d", RegisterA ? "RS" : "SS", N, Chains,
           Chains == 1 ? "-" : (Interleaved ? "interleaved" : "chain-major"), WGs, Depth);
  if (err != cudaSuccess) {
    printf("%-44s error %s\n", name, cudaGetErrorString(err));
    return;
  }
  const double per = double(worst_cta_cycles(cycles, sms)) / (double(iters) * 4 * Chains * WGs);
  out.push_back({name, N, Chains, WGs, per, per / (N / 2.0)});
  printf("%-44s %7.1f cycles/wgmma  %5.2fx tensor\n", name, per, per / (N / 2.0));
}

template <bool RS>
void sweep(std::vector<Result>& out, int sms, long long* c, float* s) {
  // Two warpgroups (the cooperative rows' CTA), drain every block (Depth 0).
  run<64, 1, false, RS, 2, 0>(out, sms, c, s);
  run<64, 2, false, RS, 2, 0>(out, sms, c, s);
  run<64, 2, true, RS, 2, 0>(out, sms, c, s);
  run<64, 4, false, RS, 2, 0>(out, sms, c, s);
  run<64, 4, true, RS, 2, 0>(out, sms, c, s);
  run<128, 1, false, RS, 2, 0>(out, sms, c, s);
  run<128, 2, false, RS, 2, 0>(out, sms, c, s);
  run<128, 2, true, RS, 2, 0>(out, sms, c, s);
  run<256, 1, false, RS, 2, 0>(out, sms, c, s);
  // One warpgroup: what a single warp per SM sub-partition gets.
  run<64, 1, false, RS, 1, 0>(out, sms, c, s);
  run<64, 4, true, RS, 1, 0>(out, sms, c, s);
  run<128, 1, false, RS, 1, 0>(out, sms, c, s);
  run<256, 1, false, RS, 1, 0>(out, sms, c, s);
  // One batch left in flight (the overlap loops' wait<1>).
  run<64, 1, false, RS, 2, 1>(out, sms, c, s);
  run<128, 1, false, RS, 2, 1>(out, sms, c, s);
}

int main(int argc, char** argv) {
  const ProbeDevice dev = probe_device();
  std::vector<Result> out;
  sweep<false>(out, dev.sms, dev.cycles, dev.sink);
  sweep<true>(out, dev.sms, dev.cycles, dev.sink);
  if (argc > 1) {
    FILE* f = open_probe_json(argv[1], dev.sms, "\"iters\": 2000, ");
    for (size_t i = 0; i < out.size(); ++i)
      fprintf(f, "  {\"name\": \"%s\", \"n\": %d, \"chains\": %d, \"wgs\": %d, \"cycles_per_wgmma\": %.2f, \"over_tensor\": %.3f}%s\n",
              out[i].name.c_str(), out[i].n, out[i].chains, out[i].wgs, out[i].cycles_per_wgmma,
              out[i].over_tensor, i + 1 < out.size() ? "," : "");
    fprintf(f, "]}\n");
    fclose(f);
  }
  return 0;
}
