// TMA ingress and shared-memory contention probe for the SM90 GEMM rows (an H200 diagnostic; not part
// of the extension).
//
// Question (gemm/NOTES.md, "The cost model"): the 128x64 swap row walks a K block in ~450-490 cycles
// against 256 of wgmma, with its consumers (not its loads) behind (ncu). Its 8
// m64n64k32 wgmma per block read 32 KiB of shared memory (A 2 KiB + B 2 KiB each), and its TMA writes
// 24 KiB. At 128 B/clk per SM, reads alone fill 256 cycles (SS m64n64k32 runs at exactly 128 B/clk:
// dev/probes/wgmma_rate_probe.cu), reads plus writes 448. Do TMA writes take shared-memory bandwidth from
// wgmma operand reads (then the row is bound by bytes per output), or not (then by its loop)?
//
// Kernels (one CTA per SM; 128x128 fp8 tiles with the 128-byte swizzle, 16 KiB per load, as the rows'
// weight tiles; a ring of 4 slots (2-12 where named), each load waiting only for the previous load into
// its slot):
//   ingress    one thread streams TMA 2D tensor loads (or 1D bulk copies of the same bytes) into the
//              ring and nothing else: the SM's TMA ingress in B/clk, by active SMs and by source
//              (L2-resident: 8 blocks per CTA, re-read; shared: every CTA the same 8 blocks; DRAM:
//              128 distinct blocks per CTA after an L2 flush).
//   contention 2 warpgroups run SS m64nNk32 wgmma on fixed tiles (4 per commit, wait<1>, as the overlap
//              loop's wgmma) while a third warp's thread streams TMA loads into the ring, one every
//              `gap` cycles at most (0: as fast as the ring allows; no writer: the wgmma alone).
//   pipeline   the 128x64 swap row's producer / 2-consumer pipeline on its stage sizes, without scale
//              loads or epilogue: TMA or no TMA, promotion or a plain add (pipeline_probe, below).
// Printed: cycles per wgmma (worst CTA), the writer's B/clk over the same window, their sum as smem
// traffic (reads: 2 KiB + N x 32 B per wgmma), and the SM clock (clock64 over globaltimer).
//
// Build and run (the H200 stage `tma_probe` of dev/device/h200_check.sh does this):
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
//        -I <nvidia-cutlass include> dev/probes/tma_ingress_probe.cu -o probe && ./probe out.json
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "cute/tensor.hpp"
#include "cute/arch/mma_sm90.hpp"
#include "cute/atom/mma_traits_sm90_gmma.hpp"
#include "cutlass/arch/barrier.h"
#include "probe_util.cuh"

using namespace cute;
using Fp8 = cutlass::float_e4m3_t;
using Barrier = cutlass::arch::ClusterTransactionBarrier;

constexpr int kTileK = 128;
constexpr int kBoxRows = 128;
constexpr int kLoadBytes = kBoxRows * kTileK;  // one 128x128 fp8 tile
constexpr int kMaxSlots = 12;  // ring slots (loads in flight): 4 unless a run says otherwise
constexpr int kBandsMax = 132;     // row bands of 128 rows in the source matrix (one per CTA)
constexpr int kSourceK = 16384;    // source columns: 128 K blocks per band (2 MiB per band)
constexpr int kL2Blocks = 8;       // blocks per CTA re-read in the L2-resident modes (132 x 128 KiB)
constexpr int kOneCtaPerSmBytes = 200 * 1024;

enum class Source : int { kL2 = 0, kL2Shared = 1, kDram = 2 };

struct Writer {
  const CUtensorMap* map;
  const uint8_t* bulk;  // the same matrix for 1D bulk copies (one tile = 128 rows x 128 B, not contiguous:
                        // the bulk variant copies 16 KiB contiguous bytes of the band instead)
  bool tensor;
  Source source;
  int slots;
};

__device__ __forceinline__ uint64_t globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// Load number i of this CTA into slot i % w.slots.
__device__ __forceinline__ void issue_load(const Writer& w, uint64_t* full, uint8_t* ring, int i) {
  const int slot = i % w.slots;
  const int band = w.source == Source::kL2Shared ? 0 : int(blockIdx.x) % kBandsMax;
  const int kb = w.source == Source::kDram ? i % (kSourceK / kTileK) : i % kL2Blocks;
  Barrier::arrive_and_expect_tx(&full[slot], kLoadBytes);
  const uint32_t dst = cute::cast_smem_ptr_to_uint(ring + slot * kLoadBytes);
  const uint32_t bar = cute::cast_smem_ptr_to_uint(&full[slot]);
  if (w.tensor) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
        :
        : "r"(dst), "l"(w.map), "r"(kb * kTileK), "r"(band * kBoxRows), "r"(bar)
        : "memory");
  } else {
    const uint8_t* src = w.bulk + (int64_t(band) * kSourceK * kBoxRows + int64_t(kb) * kLoadBytes);
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :
                 : "r"(dst), "l"(src), "r"(kLoadBytes), "r"(bar)
                 : "memory");
  }
}

// Streams loads until `loads` are issued or *stop is set, at most one per `gap` cycles; waits for all.
// Returns the number issued.
__device__ int stream_loads(const Writer& w, uint64_t* full, uint8_t* ring, int loads, long long gap,
                            volatile int* stop) {
  int i = 0;
  long long next = clock64();
  for (; i < loads; ++i) {
    if (stop != nullptr && *stop) break;
    if (i >= w.slots) Barrier::wait(&full[i % w.slots], uint32_t((i / w.slots - 1) & 1));
    if (gap > 0) {
      while (clock64() < next) {
      }
      next += gap;
    }
    issue_load(w, full, ring, i);
  }
  for (int j = std::max(0, i - w.slots); j < i; ++j) Barrier::wait(&full[j % w.slots], uint32_t((j / w.slots) & 1));
  return i;
}

struct Timing {
  long long cycles;
  unsigned long long ns;
  int loads;
};

__global__ void __launch_bounds__(32, 1) ingress(const __grid_constant__ CUtensorMap map, Writer w, int loads,
                                                 Timing* out) {
  extern __shared__ __align__(1024) uint8_t ring[];
  __shared__ uint64_t full[kMaxSlots];
  if (threadIdx.x == 0) {
    for (int s = 0; s < w.slots; ++s) Barrier::init(&full[s], 1);
    cutlass::arch::fence_barrier_init();
  }
  __syncwarp();
  if (threadIdx.x != 0) return;
  w.map = &map;
  const long long c0 = clock64();
  const uint64_t g0 = globaltimer();
  const int issued = stream_loads(w, full, ring, loads, 0, nullptr);
  out[blockIdx.x] = {clock64() - c0, globaltimer() - g0, issued};
}

template <int N>
using SsMma = decltype(make_tiled_mma(SM90::GMMA::ss_op_selector<Fp8, Fp8, float, Shape<_64, Int<N>, _32>>()));

// 384 threads: warpgroups 0 and 1 run wgmma, warp 8 (warpgroup 2) writes (when `writer`).
template <int N>
__global__ void __launch_bounds__(384, 1) contention(const __grid_constant__ CUtensorMap map, Writer w, bool writer,
                                                     long long gap, int iters, Timing* wgmma_out, Timing* writer_out,
                                                     float* sink) {
  extern __shared__ __align__(1024) uint8_t smem[];
  __shared__ uint64_t full[kMaxSlots];
  __shared__ int stop;
  constexpr int kABytes = 64 * kTileK;
  uint8_t* ring = smem + 2 * kABytes + N * kTileK;  // 1024-aligned: both sizes are multiples of 1024
  for (int i = threadIdx.x; i < 2 * kABytes + N * kTileK; i += blockDim.x) smem[i] = (i * 37 + 11) & 0x3f;
  if (threadIdx.x == 0) {
    for (int s = 0; s < w.slots; ++s) Barrier::init(&full[s], 1);
    cutlass::arch::fence_barrier_init();
    stop = 0;
  }
  __syncthreads();
  const int wg = threadIdx.x / 128;
  if (wg == 2) {
    if (threadIdx.x != 256 || !writer) return;
    w.map = &map;
    const long long c0 = clock64();
    const uint64_t g0 = globaltimer();
    const int issued = stream_loads(w, full, ring, 1 << 30, gap, &stop);
    writer_out[blockIdx.x] = {clock64() - c0, globaltimer() - g0, issued};
    return;
  }
  auto a_layout = tile_to_shape(GMMA::Layout_K_SW128_Atom<Fp8>{}, Shape<_64, Int<kTileK>>{});
  auto b_layout = tile_to_shape(GMMA::Layout_K_SW128_Atom<Fp8>{}, Shape<Int<N>, Int<kTileK>>{});
  Tensor sA = make_tensor(make_smem_ptr(reinterpret_cast<Fp8*>(smem + wg * kABytes)), a_layout);
  Tensor sB = make_tensor(make_smem_ptr(reinterpret_cast<Fp8*>(smem + 2 * kABytes)), b_layout);
  SsMma<N> mma;
  auto thr = mma.get_thread_slice(threadIdx.x % 128);
  Tensor tCrA = thr.make_fragment_A(thr.partition_A(sA));
  Tensor tCrB = thr.make_fragment_B(thr.partition_B(sB));
  Tensor acc = partition_fragment_C(mma, Shape<_64, Int<N>>{});
  clear(acc);
  warpgroup_fence_operand(acc);
  const long long c0 = clock64();
  const uint64_t g0 = globaltimer();
  mma.accumulate_ = GMMA::ScaleOut::One;
  for (int it = 0; it < iters; ++it) {
    warpgroup_arrive();
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < kTileK / 32; ++k) cute::gemm(mma, tCrA(_, 0, k), tCrB(_, 0, k), acc(_, 0, 0));
    warpgroup_commit_batch();
    warpgroup_wait<1>();
  }
  warpgroup_wait<0>();
  warpgroup_fence_operand(acc);
  const long long c1 = clock64();
  const uint64_t g1 = globaltimer();
  asm volatile("bar.sync 1, 256;" ::: "memory");  // both wgmma warpgroups done, then stop the writer
  if (threadIdx.x == 0) {
    stop = 1;
    wgmma_out[blockIdx.x] = {c1 - c0, g1 - g0, iters};
  }
  keep_live(sink, acc);
}

// The 128x64 swap row's pipeline without its scales' loads or epilogue: a producer thread fills
// `Stages` stages of A (128 weight rows x 128 K, 16 KiB) + B (64 token rows x 128 K, 8 KiB) through
// TMA (or only completes the stage's transaction bytes: `tma` false, the loop on stale data), and 2
// consumer warpgroups each run 4 m64n64k32 wgmma per stage on their 64-row half of A into a fresh
// fragment (one of Depth + 1 = 1 or 2, in turn), wait until `Depth` groups are pending, release the
// oldest stage and promote its fragment into the accumulator: with per-column scales read from shared
// memory as the overlap loop does (kScale), a plain add (kAdd), or, with `Fresh` false, not at all (kNone:
// one accumulator chained through every block; with fresh fragments and no promotion ptxas drops the
// wgmma, whose results nothing reads, so main() runs no such variant).
// `Barriers` false: the consumers walk the stages without waiting or releasing, and no producer runs.
constexpr int kPipeABytes = 128 * kTileK, kPipeBBytes = 64 * kTileK, kPipeStageBytes = kPipeABytes + kPipeBBytes;

template <int Stages>
constexpr int pipeline_smem_bytes() {
  return Stages * kPipeStageBytes + 1024;
}

enum class Promotion : int { kNone = 0, kAdd = 1, kScale = 2 };

template <int Stages, int Depth, Promotion Promote, bool Barriers, bool Fresh>
__global__ void __launch_bounds__(384, 1) pipeline_probe(const __grid_constant__ CUtensorMap a_map,
                                                         const __grid_constant__ CUtensorMap b_map, bool tma,
                                                         Source a_source, int blocks, Timing* out, float* sink) {
  extern __shared__ __align__(1024) uint8_t smem[];
  __shared__ uint64_t full[Stages], empty[Stages];
  __shared__ float column_scale[64];
  if (threadIdx.x == 0) {
    for (int s = 0; s < Stages; ++s) Barrier::init(&full[s], 1), Barrier::init(&empty[s], 2);
    cutlass::arch::fence_barrier_init();
  }
  if (threadIdx.x < 64) column_scale[threadIdx.x] = 1.0f + 1e-3f * threadIdx.x;
  for (int i = threadIdx.x; i < Stages * kPipeStageBytes; i += blockDim.x) smem[i] = (i * 37 + 11) & 0x3f;
  __syncthreads();
  const int wg = threadIdx.x / 128;
  if (wg == 2) {
    if (threadIdx.x != 256 || !Barriers) return;
    const int band = int(blockIdx.x) % kBandsMax;
    const long long c0 = clock64();
    const uint64_t g0 = globaltimer();
    for (int kb = 0; kb < blocks; ++kb) {
      const int s = kb % Stages;
      if (kb >= Stages) Barrier::wait(&empty[s], uint32_t((kb / Stages - 1) & 1));
      Barrier::arrive_and_expect_tx(&full[s], kPipeStageBytes);
      const uint32_t bar = cute::cast_smem_ptr_to_uint(&full[s]);
      const uint32_t a_dst = cute::cast_smem_ptr_to_uint(smem + s * kPipeStageBytes);
      const uint32_t b_dst = a_dst + kPipeABytes;
      if (tma) {
        const int a_kb = a_source == Source::kDram ? kb % (kSourceK / kTileK) : kb % kL2Blocks;
        asm volatile(
            "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
            :
            : "r"(a_dst), "l"(&a_map), "r"(a_kb * kTileK), "r"(band * kBoxRows), "r"(bar)
            : "memory");
        asm volatile(
            "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
            :
            : "r"(b_dst), "l"(&b_map), "r"((kb % kL2Blocks) * kTileK), "r"(0), "r"(bar)
            : "memory");
      } else {
        Barrier::complete_transaction(&full[s], 0, kPipeStageBytes);
      }
    }
    out[blockIdx.x + gridDim.x] = {clock64() - c0, globaltimer() - g0, blocks};
    return;
  }
  auto a_layout = tile_to_shape(GMMA::Layout_K_SW128_Atom<Fp8>{}, Shape<_64, Int<kTileK>>{});
  auto b_layout = tile_to_shape(GMMA::Layout_K_SW128_Atom<Fp8>{}, Shape<_64, Int<kTileK>>{});
  SsMma<64> mma;
  auto thr = mma.get_thread_slice(threadIdx.x % 128);
  Tensor acc = partition_fragment_C(mma, Shape<_64, _64>{});  // (MMA, 1, 1)
  // Separate register tensors and a hand-unrolled loop: one (MMA, 1, kFrags) tensor indexed in an
  // unrolled loop compiled to serialized wgmma (C7514).
  Tensor frag0 = make_fragment_like(acc), frag1 = make_fragment_like(acc);
  float scale0[16], scale1[16];
  clear(acc), clear(frag0), clear(frag1);
  for (int j = 0; j < 16; ++j) scale0[j] = scale1[j] = 0.f;
  const int lane_col = 2 * (threadIdx.x % 4);

  auto issue = [&](auto&& frag, float* scale, int kb) {
    const int s = kb % Stages;
    if constexpr (Barriers) Barrier::wait(&full[s], uint32_t((kb / Stages) & 1));
    if constexpr (Promote == Promotion::kScale) {
      const float block_scale = column_scale[kb % 64];
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < 16; ++j) scale[j] = column_scale[8 * (j / 2) + lane_col + (j % 2)] * block_scale;
    }
    Tensor sA = make_tensor(make_smem_ptr(reinterpret_cast<Fp8*>(smem + s * kPipeStageBytes + wg * 64 * kTileK)), a_layout);
    Tensor sB = make_tensor(make_smem_ptr(reinterpret_cast<Fp8*>(smem + s * kPipeStageBytes + kPipeABytes)), b_layout);
    Tensor tCrA = thr.make_fragment_A(thr.partition_A(sA));
    Tensor tCrB = thr.make_fragment_B(thr.partition_B(sB));
    mma.accumulate_ = Fresh ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
    warpgroup_fence_operand(frag);
    warpgroup_arrive();
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < kTileK / 32; ++k) {
      cute::gemm(mma, tCrA(_, 0, k), tCrB(_, 0, k), frag(_, 0, 0));
      mma.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
    warpgroup_fence_operand(frag);
  };
  auto release = [&](int kb) {
    if (Barriers && kb >= 0 && threadIdx.x % 128 == 0) Barrier::arrive(&empty[kb % Stages]);
  };
  auto promote = [&](auto&& frag, const float* scale) {
    warpgroup_fence_operand(frag);
    if constexpr (Promote == Promotion::kScale) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(acc); ++i) acc(i) = fmaf(frag(i), scale[(i / 4) * 2 + (i % 2)], acc(i));
    } else if constexpr (Promote == Promotion::kAdd) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(acc); ++i) acc(i) += frag(i);
    }
    warpgroup_fence_operand(acc);
  };

  const long long c0 = clock64();
  const uint64_t g0 = globaltimer();
  // Block kb goes to fragment kb % (Depth + 1); after its issue, the wait leaves Depth groups pending,
  // so block kb - Depth is complete: its stage is released and its fragment promoted.
  if constexpr (!Fresh) {
    // One accumulator chained through every block, Depth groups left pending: no promotion.
    for (int kb = 0; kb < blocks; ++kb) {
      issue(acc, scale0, kb);
      warpgroup_wait<Depth>();
      release(kb - Depth);
    }
    warpgroup_wait<0>();
  } else if constexpr (Depth == 0) {
    for (int kb = 0; kb < blocks; ++kb) {
      issue(frag0, scale0, kb);
      warpgroup_wait<0>();
      release(kb);
      promote(frag0, scale0);
    }
  } else {
    static_assert(Depth == 1, "Depth 2 (three fragments) compiled to serialized wgmma (C7514) in every form tried");
    issue(frag0, scale0, 0);
    int kb = 1;
    while (true) {
      if (kb == blocks) {
        warpgroup_wait<0>(), release(kb - 1), promote(frag0, scale0);
        break;
      }
      issue(frag1, scale1, kb), warpgroup_wait<1>(), release(kb - 1), promote(frag0, scale0);
      if (++kb == blocks) {
        warpgroup_wait<0>(), release(kb - 1), promote(frag1, scale1);
        break;
      }
      issue(frag0, scale0, kb), warpgroup_wait<1>(), release(kb - 1), promote(frag1, scale1);
      ++kb;
    }
  }
  const long long c1 = clock64();
  const uint64_t g1 = globaltimer();
  if (threadIdx.x == 0) out[blockIdx.x] = {c1 - c0, g1 - g0, blocks};
  keep_live(sink, acc);
}

// ---------------------------------------------------------------------------------------------------
// Host

struct Result {
  std::string name;
  int ctas, n;
  double cycles_per_wgmma, write_bytes_per_clk, smem_bytes_per_clk, ghz, tb_per_s;
};

static PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q;
  cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q);
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
}

static std::vector<Timing> read_timings(const Timing* d, int n) {
  std::vector<Timing> h(n);
  cudaMemcpy(h.data(), d, n * sizeof(Timing), cudaMemcpyDeviceToHost);
  return h;
}

// The slowest CTA's cycles and nanoseconds (each CTA wrote its own Timing); exits on a launch error.
struct Slowest {
  long long cycles = 0;
  unsigned long long ns = 0;
  double ghz() const { return double(cycles) / double(ns); }
};
static Slowest slowest_cta(cudaError_t err, const char* name, const Timing* d, int n) {
  if (err != cudaSuccess) {
    printf("%-60s error %s\n", name, cudaGetErrorString(err));
    exit(1);
  }
  Slowest w;
  for (const Timing& x : read_timings(d, n)) w.cycles = std::max(w.cycles, x.cycles), w.ns = std::max(w.ns, x.ns);
  return w;
}

struct Probe {
  CUtensorMap map, b_map;
  uint8_t* matrix;
  uint8_t* flush;
  size_t flush_bytes = size_t(512) << 20;
  Timing *t0, *t1;
  float* sink;
  int sms;
  std::vector<Result> out;

  Writer writer(bool tensor, Source src, int slots = 4) const { return {nullptr, matrix, tensor, src, slots}; }

  void ingress_run(const char* label, bool tensor, Source src, int ctas, int slots = 4) {
    const int loads = src == Source::kDram ? kSourceK / kTileK : 2048;
    cudaFuncSetAttribute(ingress, cudaFuncAttributeMaxDynamicSharedMemorySize, kOneCtaPerSmBytes);
    ingress<<<ctas, 32, kOneCtaPerSmBytes>>>(map, writer(tensor, src, slots), 64, t0);  // warm-up
    if (src == Source::kDram) cudaMemset(flush, 1, flush_bytes);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    cudaEventRecord(e0);
    ingress<<<ctas, 32, kOneCtaPerSmBytes>>>(map, writer(tensor, src, slots), loads, t0);
    cudaEventRecord(e1);
    cudaError_t err = cudaDeviceSynchronize();
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    char name[128];
    snprintf(name, sizeof name, "ingress %s %s ctas%d slots%d", tensor ? "tma2d" : "bulk1d", label, ctas, slots);
    const Slowest w = slowest_cta(err, name, t0, ctas);
    const double bytes = double(loads) * kLoadBytes;
    const double per_clk = bytes / w.cycles, ghz = w.ghz();
    const double tbs = bytes * ctas / (ms * 1e-3) / 1e12;
    out.push_back({name, ctas, 0, 0, per_clk, per_clk, ghz, tbs});
    printf("%-44s %6.1f B/clk/SM  %5.2f GHz  %5.2f TB/s (events)\n", name, per_clk, ghz, tbs);
  }

  template <int Stages, int Depth, Promotion Promote, bool Barriers = true, bool Fresh = true>
  void pipeline_run(bool tma, Source a_source, int ctas) {
    constexpr int kSmem = pipeline_smem_bytes<Stages>();
    auto k = pipeline_probe<Stages, Depth, Promote, Barriers, Fresh>;
    cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, std::max(kSmem, kOneCtaPerSmBytes));
    const int blocks = a_source == Source::kDram ? 126 : 1020;
    k<<<ctas, 384, std::max(kSmem, kOneCtaPerSmBytes)>>>(map, b_map, tma, a_source, 12, t0, sink);
    if (a_source == Source::kDram) cudaMemset(flush, 1, flush_bytes);
    k<<<ctas, 384, std::max(kSmem, kOneCtaPerSmBytes)>>>(map, b_map, tma, a_source, blocks, t0, sink);
    cudaError_t err = cudaDeviceSynchronize();
    static const char* kPromotion[] = {"none", "add", "scale"};
    char name[160];
    snprintf(name, sizeof name, "pipeline stages%d depth%d %s%s %s %s ctas%d", Stages, Depth,
             Fresh ? kPromotion[int(Promote)] : "chained", Barriers ? "" : " no-barriers", tma ? "tma" : "no-tma",
             a_source == Source::kDram ? "dram" : "l2", ctas);
    const Slowest w = slowest_cta(err, name, t0, ctas);
    const double per_block = double(w.cycles) / blocks;
    const double ingress = tma ? kPipeStageBytes / per_block : 0;
    out.push_back({name, ctas, 64, per_block / 8, ingress, 0, w.ghz(), 0});
    printf("%-60s %6.1f cycles/block (%.2fx wgmma)  ingress %5.1f B/clk  %4.2f GHz\n", name, per_block,
           per_block / 256.0, ingress, w.ghz());
  }

  template <int N>
  void contention_run(bool with_writer, long long gap, int ctas, int slots = 4) {
    const int kSmem = 2 * 64 * kTileK + N * kTileK + slots * kLoadBytes + 1024;
    auto k = contention<N>;
    cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, std::max(kSmem, kOneCtaPerSmBytes));
    const int iters = 4000;
    cudaMemset(t1, 0, sms * sizeof(Timing));
    k<<<ctas, 384, std::max(kSmem, kOneCtaPerSmBytes)>>>(map, writer(true, Source::kL2, slots), with_writer, gap, 100, t0, t1, sink);
    k<<<ctas, 384, std::max(kSmem, kOneCtaPerSmBytes)>>>(map, writer(true, Source::kL2, slots), with_writer, gap, iters, t0, t1, sink);
    cudaError_t err = cudaDeviceSynchronize();
    char name[128];
    snprintf(name, sizeof name, "contention n%d ctas%d %s gap%lld slots%d", N, ctas, with_writer ? "writer" : "alone", gap,
             slots);
    const Slowest w = slowest_cta(err, name, t0, ctas);
    // The slowest writer's bytes per cycle over its window (from before the wgmma start to after their
    // end; its extra cycles at the ends are a few loads).
    double min_write = 1e30;
    if (with_writer) {
      for (const Timing& x : read_timings(t1, ctas)) min_write = std::min(min_write, double(x.loads) * kLoadBytes / x.cycles);
    } else {
      min_write = 0;
    }
    const double per = double(w.cycles) / (double(iters) * 4 * 2);  // per wgmma per SM (both warpgroups)
    const double read_per_clk = (2048.0 + N * 32.0) / per;
    out.push_back({name, ctas, N, per, min_write, read_per_clk + min_write, w.ghz(), 0});
    printf("%-44s %6.1f cycles/wgmma (%.2fx tensor)  write %5.1f B/clk  reads+writes %6.1f B/clk  %4.2f GHz\n",
           name, per, per / (N / 2.0), min_write, read_per_clk + min_write, w.ghz());
  }
};

int main(int argc, char** argv) {
  Probe p;
  cudaDeviceGetAttribute(&p.sms, cudaDevAttrMultiProcessorCount, 0);
  const size_t rows = size_t(kBandsMax) * kBoxRows;
  cudaMalloc(&p.matrix, rows * kSourceK);
  cudaMemset(p.matrix, 0x11, rows * kSourceK);
  cudaMalloc(&p.flush, p.flush_bytes);
  cudaMalloc(&p.t0, p.sms * sizeof(Timing));
  cudaMalloc(&p.t1, p.sms * sizeof(Timing));
  cudaMalloc(&p.sink, sizeof(float));
  const cuuint64_t dims[2] = {cuuint64_t(kSourceK), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(kSourceK)};
  const cuuint32_t box[2] = {cuuint32_t(kTileK), cuuint32_t(kBoxRows)};
  const cuuint32_t elem[2] = {1, 1};
  CUresult r = encode_fn()(&p.map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, p.matrix, dims, strides, box, elem,
                           CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    printf("cuTensorMapEncodeTiled failed: %d\n", int(r));
    return 1;
  }
  const cuuint32_t b_box[2] = {cuuint32_t(kTileK), 64};
  r = encode_fn()(&p.b_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, p.matrix, dims, strides, b_box, elem,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    printf("cuTensorMapEncodeTiled (B) failed: %d\n", int(r));
    return 1;
  }
  const int sms = p.sms;
  // The 128x64 swap row's pipeline (96 CTAs: M = 128 on n = 6144). First the loop alone (no TMA), to
  // tell what costs: barriers, the wait depth, fresh fragments, the promotion and its scale loads.
  using P = Promotion;
  p.pipeline_run<8, 1, P::kAdd>(false, Source::kL2, sms);                  // call 2's loop
  p.pipeline_run<8, 1, P::kAdd, false>(false, Source::kL2, sms);           // no barriers
  p.pipeline_run<8, 0, P::kAdd, false>(false, Source::kL2, sms);           // drain every block
  p.pipeline_run<8, 1, P::kNone, false, false>(false, Source::kL2, sms);   // one chained accumulator
  p.pipeline_run<8, 0, P::kNone, false, false>(false, Source::kL2, sms);
  p.pipeline_run<8, 1, P::kNone, true, false>(false, Source::kL2, sms);    // chained, with barriers
  p.pipeline_run<8, 1, P::kScale, false>(false, Source::kL2, sms);
  p.pipeline_run<8, 0, P::kScale, false>(false, Source::kL2, sms);
  p.pipeline_run<8, 1, P::kScale>(false, Source::kL2, sms);
  p.pipeline_run<8, 0, P::kScale>(false, Source::kL2, sms);
  // With TMA at the row's 96 CTAs.
  p.pipeline_run<8, 1, P::kScale>(true, Source::kL2, 96);
  p.pipeline_run<8, 0, P::kScale>(true, Source::kL2, 96);
  p.pipeline_run<8, 1, P::kScale>(true, Source::kDram, 96);
  p.pipeline_run<8, 1, P::kNone, true, false>(true, Source::kL2, 96);
  p.pipeline_run<8, 1, P::kNone, true, false>(true, Source::kDram, 96);
  // Ingress alone.
  for (int ctas : {1, 8, 33, 66, sms}) p.ingress_run("l2", true, Source::kL2, ctas);
  for (int ctas : {8, sms}) p.ingress_run("l2", false, Source::kL2, ctas);
  for (int ctas : {8, sms}) p.ingress_run("l2shared", true, Source::kL2Shared, ctas);
  for (int slots : {2, 8, 12}) p.ingress_run("l2", true, Source::kL2, 8, slots);
  p.ingress_run("l2", true, Source::kL2, sms, 12);
  for (int ctas : {8, 66, sms}) p.ingress_run("dram", true, Source::kDram, ctas);
  // wgmma against a writer: alone, unthrottled, and at ~32 / ~64 B/clk (a 16 KiB load per 512 / 256 cycles).
  for (int ctas : {8, sms}) {
    p.contention_run<64>(false, 0, ctas);
    p.contention_run<64>(true, 0, ctas);
    p.contention_run<64>(true, 512, ctas);
    p.contention_run<64>(true, 256, ctas);
    p.contention_run<128>(false, 0, ctas);
    p.contention_run<128>(true, 0, ctas);
    p.contention_run<128>(true, 256, ctas);
    p.contention_run<64>(true, 0, ctas, 12);
    p.contention_run<128>(true, 0, ctas, 12);
  }
  if (argc > 1) {
    FILE* f = open_probe_json(argv[1], sms, "\"load_bytes\": 16384, ");
    for (size_t i = 0; i < p.out.size(); ++i) {
      const Result& x = p.out[i];
      fprintf(f,
              "  {\"name\": \"%s\", \"ctas\": %d, \"n\": %d, \"cycles_per_wgmma\": %.2f, \"write_bytes_per_clk\": %.2f, "
              "\"smem_bytes_per_clk\": %.2f, \"ghz\": %.3f, \"tb_per_s\": %.3f}%s\n",
              x.name.c_str(), x.ctas, x.n, x.cycles_per_wgmma, x.write_bytes_per_clk, x.smem_bytes_per_clk, x.ghz,
              x.tb_per_s, i + 1 < p.out.size() ? "," : "");
    }
    fprintf(f, "]}\n");
    fclose(f);
  }
  return 0;
}
