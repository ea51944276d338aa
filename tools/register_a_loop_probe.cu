// The register-A consumer loop without its pipeline (an H200 diagnostic; not part of the extension).
//
// Question (gemm/NOTES.md, thirteenth session): the removed candidate `sm90_coop_128x256x128_c2x1_rs`
// (its consumer loop: sm90_register_a_mainloop.cuh at git 7750437) took ~1450 cycles a K block in the
// kernel where its 32 m64n64k32 register-A wgmma need 1024 (they run at the tensor rate on their own:
// tools/wgmma_rate_probe.cu). Is the loop itself slow (slice loads, promotions, waits), or what the
// kernel adds around it (TMA refills, barriers, the 2-CTA cluster's multicast)?
// Each CTA here (one per SM, 2 consumer warpgroups, no producer) walks `blocks` K blocks over
// `Stages` shared-memory stages that were filled once: per block and warpgroup the same sequence as
// that loop's schedule (quarter 0; the previous block's quarter 3 promoted; quarters
// 1 and 2 each promoted behind the next; quarter 3 one K slice per group with the next block's slices
// loaded by ldmatrix as they free up), with the promotions and scale loads. Variant: the slices are
// loaded once and never reloaded (what the reloads and their waits cost).
// Printed: cycles per K block (worst CTA) and that over 1024.
//
// Build and run (the H200 stage `wgmma_probe` of tools/h200_check.sh does this):
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
//        -I <nvidia-cutlass include> tools/register_a_loop_probe.cu -o probe && ./probe out.json
#include <cuda_runtime.h>

#include <cstdio>

#include "cute/tensor.hpp"
#include "cute/arch/mma_sm90.hpp"
#include "cute/atom/mma_traits_sm90_gmma.hpp"
#include "probe_util.cuh"

using namespace cute;
using Fp8 = cutlass::float_e4m3_t;

constexpr int kTileK = 128;
constexpr int kStages = 4;
constexpr int kWarpgroupRows = 64;
constexpr int kTileN = 256;
constexpr int kABytes = 2 * kWarpgroupRows * kTileK;  // both warpgroups' rows
constexpr int kBBytes = kTileN * kTileK;
constexpr int kStageBytes = kABytes + kBBytes;
constexpr int kScaleBytes = kStages * (2 * kWarpgroupRows + 2) * 4;

using Mma = decltype(make_tiled_mma(SM90::GMMA::MMA_64x64x32_F32E4M3E4M3_RS_TN<>{}));

template <bool Reload>
__global__ void __launch_bounds__(256, 1) loop_probe(int blocks, long long* cycles, float* sink) {
  extern __shared__ __align__(1024) uint8_t smem[];
  for (int i = threadIdx.x; i < kStages * kStageBytes; i += blockDim.x) smem[i] = (i * 37 + 11) & 0x3f;
  float* scales = reinterpret_cast<float*>(smem + kStages * kStageBytes);
  for (int i = threadIdx.x; i < kScaleBytes / 4; i += blockDim.x) scales[i] = 1.0f + 1e-3f * (i % 7);
  __syncthreads();

  const int wg = threadIdx.x / 128;
  const int tid = threadIdx.x % 128;
  auto a_layout = tile_to_shape(GMMA::Layout_K_SW128_Atom<Fp8>{},
                                make_shape(Int<kWarpgroupRows>{}, Int<kTileK>{}, Int<kStages>{}));
  auto b_layout = tile_to_shape(GMMA::Layout_K_SW128_Atom<Fp8>{},
                                make_shape(Int<kTileN>{}, Int<kTileK>{}, Int<kStages>{}));
  // Stage s: [A of warpgroup 0 | A of warpgroup 1 | B]; the layouts' stage stride is their own
  // size, so each operand gets its own region: A regions first, then B.
  Tensor sA = make_tensor(make_smem_ptr(reinterpret_cast<Fp8*>(smem + wg * kStages * kWarpgroupRows * kTileK)), a_layout);
  Tensor sB = make_tensor(make_smem_ptr(reinterpret_cast<Fp8*>(smem + kStages * kABytes)), b_layout);

  Mma mma;
  auto thr = mma.get_thread_slice(tid);
  Tensor tCrA = thr.partition_fragment_A(sA(_, _, 0));          // (MMA, 1, 4)
  Tensor tCrB = thr.make_fragment_B(thr.partition_B(sB));        // (MMA, 4 quarters, 4, stages)
  auto a_copy = make_tiled_copy_A(Copy_Atom<SM75_U32x4_LDSM_N, Fp8>{}, mma);
  Tensor tAsA = a_copy.get_thread_slice(tid).partition_S(sA);   // (CPY, 1, 4, stages)
  Tensor tArA = a_copy.get_thread_slice(tid).retile_D(tCrA);
  Tensor acc = partition_fragment_C(mma, Shape<Int<kWarpgroupRows>, Int<kTileN>>{});  // (MMA, 1, 4)
  Tensor tmp0 = partition_fragment_C(mma, Shape<Int<kWarpgroupRows>, _64>{});
  Tensor tmp1 = make_fragment_like(tmp0);
  float scale0[2], scale1[2];
  bool in_loop = false;

  auto load_slice = [&](int kk, int stage) {
    if (!Reload && in_loop) return;  // the variant without reloads keeps block 0's slices
    warpgroup_fence_operand(tCrA);
    copy(a_copy, tAsA(_, _, kk, stage), tArA(_, _, kk));
    warpgroup_fence_operand(tCrA);
  };
  auto load_scales = [&](float* dst, int stage, int block) {
    {
      const float* s = scales + stage * (2 * kWarpgroupRows + 2);
      const float weight = s[2 * kWarpgroupRows + block];
      dst[0] = s[wg * kWarpgroupRows + tid / 4] * weight;
      dst[1] = s[wg * kWarpgroupRows + tid / 4 + 8] * weight;
    }
  };
  auto issue = [&](int q, int kk, auto& frag, int stage) {
    mma.accumulate_ = kk == 0 ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
    cute::gemm(mma, tCrA(_, 0, kk), tCrB(_, q, kk, stage), frag(_, 0, 0));
  };
  auto issue_quarter = [&](int q, auto& frag, int stage) {
    warpgroup_fence_operand(frag);
    warpgroup_arrive();
    CUTLASS_PRAGMA_UNROLL
    for (int kk = 0; kk < 4; ++kk) issue(q, kk, frag, stage);
    warpgroup_commit_batch();
    warpgroup_fence_operand(frag);
  };
  auto issue_step = [&](int q, int kk, auto& frag, int stage) {
    warpgroup_fence_operand(frag);
    warpgroup_arrive();
    issue(q, kk, frag, stage);
    warpgroup_commit_batch();
    warpgroup_fence_operand(frag);
  };
  auto promote = [&](auto q, auto& frag, const float* scale) {
    {
      constexpr int kFirst = decltype(q)::value * 32;
      warpgroup_fence_operand(frag);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < 32; ++i) acc(kFirst + i) = fmaf(frag(i), scale[(i / 2) % 2], acc(kFirst + i));
      warpgroup_fence_operand(acc);
    }
  };

  clear(acc);
  clear(tmp1);
  scale1[0] = scale1[1] = 0.f;
  load_scales(scale0, 0, 0);
  CUTLASS_PRAGMA_UNROLL
  for (int kk = 0; kk < 4; ++kk) load_slice(kk, 0);
  __syncthreads();
  const long long t0 = clock64();
  in_loop = true;
  int stage = 0;
  CUTLASS_PRAGMA_NO_UNROLL
  for (int b = 0; b < blocks; ++b) {
    issue_quarter(0, tmp0, stage);
    warpgroup_wait<1>();
    promote(Int<3>{}, tmp1, scale1);
    load_scales(scale1, stage, 1);
    issue_quarter(1, tmp1, stage);
    warpgroup_wait<1>();
    promote(Int<0>{}, tmp0, scale0);
    issue_quarter(2, tmp0, stage);
    warpgroup_wait<1>();
    promote(Int<1>{}, tmp1, scale0);
    CUTLASS_PRAGMA_UNROLL
    for (int kk = 0; kk < 4; ++kk) issue_step(3, kk, tmp1, stage);
    warpgroup_wait<4>();
    promote(Int<2>{}, tmp0, scale1);
    const int next = stage + 1 == kStages ? 0 : stage + 1;
    load_scales(scale0, next, 0);
    warpgroup_wait<3>();
    load_slice(0, next);
    warpgroup_wait<2>();
    load_slice(1, next);
    warpgroup_wait<1>();
    load_slice(2, next);
    warpgroup_wait<0>();
    load_slice(3, next);
    stage = next;
  }
  promote(Int<3>{}, tmp1, scale1);
  warpgroup_fence_operand(acc);
  __syncthreads();
  const long long t1 = clock64();
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
  keep_live(sink, acc, tmp0, tmp1);
}

template <bool Reload>
double run(int sms, long long* cycles, float* sink, const char* name, FILE* json, bool last) {
  auto kernel = loop_probe<Reload>;
  const int smem = kStages * kStageBytes + kScaleBytes + 1024;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  const int blocks = 4000;
  kernel<<<sms, 256, smem>>>(100, cycles, sink);  // warm-up (clocks up)
  kernel<<<sms, 256, smem>>>(blocks, cycles, sink);
  if (cudaDeviceSynchronize() != cudaSuccess) {
    printf("%-28s error %s\n", name, cudaGetErrorString(cudaGetLastError()));
    return -1;
  }
  const double per = double(worst_cta_cycles(cycles, sms)) / blocks;
  printf("%-28s %7.1f cycles per K block  %5.2fx the 1024 of wgmma\n", name, per, per / 1024.0);
  if (json)
    fprintf(json, "  {\"name\": \"%s\", \"cycles_per_block\": %.1f, \"over_wgmma\": %.3f}%s\n", name, per,
            per / 1024.0, last ? "" : ",");
  return per;
}

int main(int argc, char** argv) {
  const ProbeDevice dev = probe_device();
  FILE* json = nullptr;
  if (argc > 1) json = open_probe_json(argv[1], dev.sms, "\"blocks\": 4000, ");
  run<true>(dev.sms, dev.cycles, dev.sink, "the loop", json, false);
  run<false>(dev.sms, dev.cycles, dev.sink, "the loop, no slice reloads", json, true);
  if (json) {
    fprintf(json, "]}\n");
    fclose(json);
  }
  return 0;
}
