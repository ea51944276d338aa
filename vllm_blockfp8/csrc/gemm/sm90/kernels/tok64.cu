// SM90 (sm_90a only) W8A8 block-scaled FP8 GEMM on 64-token tiles with one math warpgroup: tile-table
// rows sm90_tok64_fitn (M <= 128) and sm90_tok64_fitn_narrow (M > 256, narrow layers) of gemm/sm90/table.h (bf16 and
// fp16 out, every width in tok64.h's kTileWidths).
//
//   D[m, n] = sum_kb (A[m, kb-block] . B[n, kb-block]) * SFA[m, kb] * SFB[n / 128, kb]
//
// Layouts as gemm.h. Unswapped: 64 tokens on the wgmma M side, TileN weight rows on the N side, with
// TileN (16..192) picked per problem so that the tiles fill about one wave (plan.cpp, tok64_width). A tile may
// straddle two 128-row weight scale blocks (e.g. 96 wide at n0 = 96), which CUTLASS's blockwise
// collective cannot express (its scale tile is TileN / 128 blocks), hence this kernel of our own.
// One producer warp first copies the tile's weight scales for every K block (one or two 128-row blocks) into
// shared memory by cp.async (its 32 lanes), then loads each K block's A (64x128), B (TileNx128) and token
// scales (64 fp32) by TMA (lane 0) into a ring of 6-16 stages; one math warpgroup runs 4 m64nTileNk32 SS
// wgmma per block into a fresh fragment, drains them, releases the stage (one arrive per warp) and
// promotes: acc += partial * token scale (2 rows per thread) * weight scale (per 8-column group: the block
// below or above the 128-row boundary: at 192 wide a constant of one of two K-loop instantiations, at the other
// straddling widths a select per group).
// The K loop is unrolled by the stage count. Epilogue: from registers, each lane quad's words transposed by shuffles
// so that a lane stores 16 bytes (8 at the last two 8-column groups where TileN % 32 == 16), masked at M and N.
// Non-persistent 1-D grid, a weight tile's token tiles on consecutive CTAs; K walked whole (no split, no workspace).
// Unsupported (gemm.h; plan.cpp's rejects() refuses it first): k % 128 != 0, n % 8 != 0, misaligned pointers; bias.
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED  // one wgmma per K slice at N = 48 / 80 / 112 / 144 / 160 too

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <utility>

#include "cute/tensor.hpp"
#include "cute/arch/copy_sm90_desc.hpp"
#include "cute/arch/mma_sm90.hpp"
#include "cute/atom/mma_traits_sm90_gmma.hpp"
#include "cutlass/arch/barrier.h"
#include "../../../common/convert.cuh"
#include "tok64.h"

namespace blockfp8::gemm::sm90::tok64 {
namespace {

using namespace cute;
using Fp8 = cutlass::float_e4m3_t;
using Barrier = cutlass::arch::ClusterTransactionBarrier;

constexpr int kTileK = 128;
constexpr int kMathThreads = 128;              // one warpgroup: warps 0-3
constexpr int kThreads = kMathThreads + 32;    // + the producer warp (lane 0 issues)
constexpr int kSmemBytes = 227 * 1024;         // the SM90 opt-in maximum per block
constexpr int kMaxStages = 16;
constexpr int kABytes = kTokenTile * kTileK;   // 8 KiB
constexpr int kScaleBytes = kTokenTile * 4;    // the block's 64 token scales
constexpr int kStageWeightScaleBytes = 8;      // probe::kStageWeightScales: the block's two weight scales
// The tile's weight scales for every K block (two rows: below and above a 128-row boundary), copied to shared
// memory once by the producer warp ahead of its first TMA load; past this many K blocks (K > 32768) the math
// threads read them from global memory each block instead.
constexpr int kMaxResidentKBlocks = 256;
constexpr int kResidentWeightScaleBytes = 2 * 4 * kMaxResidentKBlocks;

// Diagnostic variants, bits of the kernel's kProbe (the split probe that timed them against the row lives in git history;
// the extension instantiates 0 only).
namespace probe {
constexpr int kNoMath = 1;             // the math warpgroup waits for each stage and releases it: the data path
                                       // alone (the output is zeros)
constexpr int kNoLoads = 2;            // the producer arrives on each stage without loading it: the loop alone
constexpr int kStageWeightScales = 4;  // the fifteenth session's weight scales: a cp.async into each stage,
                                       // a second arrival on its full barrier
constexpr int kThreadRelease = 8;      // every math thread arrives on the empty barrier (count 128), not one
                                       // lane per warp
constexpr int kRuntimeBoundary = 16;   // the straddle boundary as a runtime value at every width (the row before
                                       // E24: a weight-scale select per 8-column group, twenty-third session)
// The fixed cost per call apart (twenty-fifth session): each leaves one part of the prologue, epilogue or code out.
constexpr int kNoWeightScales = 32;    // no resident weight-scale copy and no wait on it; every weight scale is 1
constexpr int kNoStores = 64;          // the epilogue stores nothing (the accumulators kept live by a compare)
constexpr int kDirectStores = 256;     // the epilogue before the twenty-fifth session: 4 bytes a lane as the wgmma
                                       // accumulator holds them (each warp store: 8 rows x 16 bytes, half sectors)
constexpr int kTimeline = 512;         // thread 0 writes %globaltimer and clock64 at 6 points of its CTA's life to
                                       // timeline (entry, after the grid dependency wait, the weight scales, the
                                       // first stage's data, the K loop, the epilogue); it waits on stage 0 once more
}  // namespace probe
// kTimeline's buffer: 16 values a CTA (6 global times in ns, then from slot 8 the 6 SM clocks), set by the probe.
__device__ long long* timeline = nullptr;

template <int TileN>
struct Tile {
  static constexpr int kBBytes = TileN * kTileK;
  static constexpr int kStageBytes = kABytes + kBBytes + kScaleBytes + kStageWeightScaleBytes;
  // The resident weight scales, the barriers (2 x 8 B per stage and one for the scales) and the 1 KiB
  // alignment of the swizzled tiles come off the top.
  static constexpr int kStages =
      std::min(kMaxStages, (kSmemBytes - 1024 - kResidentWeightScaleBytes - 16 * kMaxStages - 8) / kStageBytes);
  static constexpr int kSmem = 1024 + kStages * kStageBytes + kResidentWeightScaleBytes + 16 * kStages + 8;
  // Widths dividing 128 never straddle a weight scale block: one weight scale per block, no selects.
  static constexpr bool kOneWeightScale = 128 % TileN == 0;
  // A tile starts at a multiple of TileN, i.e. at most 128 - gcd(TileN, 128) rows into a scale block; the kernel
  // promotes with two weight scales (the block below and the one above), so the tile must end in the next one.
  static_assert(TileN - std::gcd(TileN, 128) <= 128, "a tile would straddle three weight scale blocks");
  // The 8-column group where the block above starts (kGroups: none in the tile) takes one value per tile start
  // modulo 128, kStarts of them. With two (192 wide), each gets its own instantiation of the K loop, so every
  // group's scale product is a compile-time choice (E24: at a runtime boundary the compiler selected a weight scale
  // per group, multiplied it by both token scales and spilled the group predicates every K block: 254 SASS
  // instructions a block at 64x192, 141 at 64x96 against DeepGEMM's 90-94; gemm/NOTES.md twenty-third session).
  // At 48-160 wide, loop copies (E24b: compiled, inlined, no C75xx) took the loop alone 0.90-0.96x its time a K block
  // at 96-160 (1.03-1.06x at 48 / 80) and the row 0.97-1.05x (the data path binds there): not worth ~3x the unit's
  // compile time, so those widths keep the runtime boundary (gemm/NOTES.md twenty-fourth session).
  static constexpr int kGroups = TileN / 8;
  static constexpr int kStarts = 128 / std::gcd(TileN, 128);
  static constexpr int kStartStep = 128 / kStarts;
  static constexpr bool kBoundaryAtCompileTime = !kOneWeightScale && kStarts <= 2;
  static_assert(kGroups * 8 == TileN, "8-column groups of the wgmma accumulator");
  static constexpr int boundary(int start) { return std::min(kGroups, (128 - start % 128) / 8); }
  // Whether no earlier tile start has this start's boundary (the dispatch tests each boundary once).
  static constexpr bool new_boundary(int start) {
    for (int s = 0; s < start; s += kStartStep)
      if (boundary(s) == boundary(start)) return false;
    return true;
  }
  static_assert(kStages >= 4, "too few stages to keep the loads in flight");
  static_assert(kSmem <= kSmemBytes, "shared memory over the SM90 maximum");
  using Mma = decltype(make_tiled_mma(SM90::GMMA::ss_op_selector<Fp8, Fp8, float, Shape<_64, Int<TileN>, _32>>()));
};

struct Params {
  const float* b_scale;  // [ceil(n / 128), k / 128]
  void* d;
  int m, n, k_blocks;
  int m_tiles;
};

// One 2D TMA load into shared memory, completing on `bar`. No L2 cache-policy operand: evict-normal on every
// load and evict-first on the weights were both 2-6% slower a K block (gemm/NOTES.md sixteenth session, E10).
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int x, int y, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
      :
      : "r"(dst), "l"(map), "r"(x), "r"(y), "r"(cute::cast_smem_ptr_to_uint(bar))
      : "memory");
}

// f(Int<I>{}) for each I, unrolled. Every lambda of the math warpgroup is marked always-inline as well: E24's
// dispatch by a recursive lambda stayed an out-of-line call wherever it had three or more K-loop copies, and ptxas
// serialized the wgmma inside it (C7519 / C7520; twenty-fourth session).
#define TOK64_INLINE __attribute__((always_inline))
template <class F, int... I>
__device__ __forceinline__ void for_each_index(F&& f, std::integer_sequence<int, I...>) {
  (f(cute::Int<I>{}), ...);
}

// A 4x4 transpose of 32-bit words across the 4 lanes of a quad: lane q's v[j] ends in lane j's v[q]. Two butterfly
// stages: the off-diagonal 2x2 blocks swap between lanes q and q ^ 2, then each 2x2 block transposes between lanes q
// and q ^ 1 (4 shuffles a lane).
__device__ __forceinline__ void quad_transpose(uint32_t (&v)[4], const int q) {
  const bool hi = q & 2, odd = q & 1;
  CUTLASS_PRAGMA_UNROLL
  for (int k = 0; k < 2; ++k) {
    const uint32_t got = __shfl_xor_sync(0xffffffffu, hi ? v[k] : v[k + 2], 2);
    v[k] = hi ? got : v[k], v[k + 2] = hi ? v[k + 2] : got;
  }
  CUTLASS_PRAGMA_UNROLL
  for (int b = 0; b < 2; ++b) {
    const uint32_t got = __shfl_xor_sync(0xffffffffu, odd ? v[2 * b] : v[2 * b + 1], 1);
    v[2 * b] = odd ? got : v[2 * b], v[2 * b + 1] = odd ? v[2 * b + 1] : got;
  }
}

template <int TileN, class Out, int kProbe>
__global__ void __launch_bounds__(kThreads, 1)
    tok64_gemm(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
               const __grid_constant__ CUtensorMap a_scale_map, const Params p) {
  using T = Tile<TileN>;
  constexpr int S = T::kStages;
  constexpr bool kMath = !(kProbe & probe::kNoMath), kLoads = !(kProbe & probe::kNoLoads);
  constexpr bool kStageScales = kProbe & probe::kStageWeightScales;
  constexpr bool kThreadRelease = kProbe & probe::kThreadRelease;
  constexpr bool kBoundaryAtCompileTime = T::kBoundaryAtCompileTime && !(kProbe & probe::kRuntimeBoundary);
  constexpr bool kNoWeightScales = kProbe & probe::kNoWeightScales, kNoStores = kProbe & probe::kNoStores;
  constexpr bool kDirectStores = kProbe & probe::kDirectStores;
  constexpr bool kTimeline = kProbe & probe::kTimeline;
  const auto mark = [&](const int i) TOK64_INLINE {
    if constexpr (kTimeline) {
      if (threadIdx.x == 0) {
        long long now;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        timeline[16 * blockIdx.x + i] = now, timeline[16 * blockIdx.x + 8 + i] = clock64();
      }
    }
  };
  mark(0);
  constexpr int kFullArrivals = kStageScales ? 2 : 1;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // Aligned by an offset from smem_raw, so that the compiler still knows every pointer below is shared memory and
  // reads the scales with LDS (a round trip through an integer address made them generic loads, LD).
  uint8_t* smem = smem_raw + ((1024 - (cute::cast_smem_ptr_to_uint(smem_raw) & 1023)) & 1023);
  uint8_t* smem_a = smem;                              // S x 8 KiB
  uint8_t* smem_b = smem_a + S * kABytes;              // S x TileN x 128
  float* smem_a_scale = reinterpret_cast<float*>(smem_b + S * T::kBBytes);  // S x 64
  float2* smem_stage_b_scale = reinterpret_cast<float2*>(smem_a_scale + S * kTokenTile);  // S x (below, above)
  float* smem_b_scale = reinterpret_cast<float*>(smem_stage_b_scale + S);  // 2 x kMaxResidentKBlocks
  uint64_t* full = reinterpret_cast<uint64_t*>(smem_b_scale + 2 * kMaxResidentKBlocks);
  uint64_t* empty = full + S;
  uint64_t* scales_ready = empty + S;  // the resident weight scales: one cp.async arrival per producer lane

  // The token tiles of one weight tile on consecutive CTAs (as DeepGEMM orders them): they read the same
  // weight lines at about the same time (per K block 0.279 against 0.291 us at M = 128, N = 6144, 0.542
  // against 0.634 at M = 256, gemm/NOTES.md fifteenth session).
  const int n0 = int(blockIdx.x) / p.m_tiles * TileN;
  const int m0 = int(blockIdx.x) % p.m_tiles * kTokenTile;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  if (threadIdx.x == 0) {
    // full: the producer's arrive with the TMA bytes. empty: lane 0 of each math warp, after __syncwarp
    // orders its lanes' reads of the stage before the release (the stage holds only TMA-written data).
    for (int s = 0; s < S; ++s)
      Barrier::init(&full[s], kFullArrivals), Barrier::init(&empty[s], kThreadRelease ? kMathThreads : 4);
    Barrier::init(scales_ready, 32);
    cutlass::arch::fence_barrier_init();
  }
  if (warp == 4 && lane == 0) {
    // Prefetching the descriptors is not a global read of data another kernel writes.
    asm volatile("prefetch.tensormap [%0];" ::"l"(&a_map) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(&b_map) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(&a_scale_map) : "memory");
  }
  __syncthreads();
  // Programmatic dependent launch: nothing global is read before the previous kernel's results are
  // visible (a no-op for a plain launch).
  asm volatile("griddepcontrol.wait;" ::: "memory");
  mark(1);

  // The tile's weight scale rows: the 128-row block of n0 and the next one (the same at the last block).
  const int scale_block = n0 / 128;
  const int last_block = (p.n + 127) / 128 - 1;
  const float* b_scale_lo = p.b_scale + int64_t(scale_block) * p.k_blocks;
  const float* b_scale_hi = p.b_scale + int64_t(min(scale_block + 1, last_block)) * p.k_blocks;
  const bool resident_scales = !kStageScales && !kNoWeightScales && p.k_blocks <= kMaxResidentKBlocks;
  if (warp == 4) {
    // The resident weight scales first, by cp.async from the 32 lanes, so that their requests go out ahead
    // of the ring's TMA loads (the math threads' own loads of them went out behind ~16 stages of loads:
    // ~3% of the row's time at M = 32..64, gemm/NOTES.md sixteenth session, calls 2 and 4).
    if (resident_scales) {
      for (int i = lane; i < p.k_blocks; i += 32) {
        const uint32_t dst = cute::cast_smem_ptr_to_uint(&smem_b_scale[i]);
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(b_scale_lo + i) : "memory");
        if constexpr (!T::kOneWeightScale)
          asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst + 4 * kMaxResidentKBlocks),
                       "l"(b_scale_hi + i)
                       : "memory");
      }
      asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(cute::cast_smem_ptr_to_uint(
                       scales_ready))
                   : "memory");
    }
    __syncwarp();
    if (lane != 0) return;
    int s = 0;
    uint32_t phase = 0;
    for (int kb = 0; kb < p.k_blocks; ++kb) {
      if (kb >= S) Barrier::wait(&empty[s], phase ^ 1);
      if constexpr (!kLoads) {
        for (int i = 0; i < kFullArrivals; ++i) Barrier::arrive(&full[s]);
      } else {
        if constexpr (kStageScales) {
          const uint32_t w_dst = cute::cast_smem_ptr_to_uint(&smem_stage_b_scale[s]);
          asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(w_dst), "l"(b_scale_lo + kb) : "memory");
          if constexpr (!T::kOneWeightScale)
            asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(w_dst + 4), "l"(b_scale_hi + kb) : "memory");
          asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(cute::cast_smem_ptr_to_uint(
                           &full[s]))
                       : "memory");
        }
        Barrier::arrive_and_expect_tx(&full[s], kABytes + T::kBBytes + kScaleBytes);
        tma_load_2d(cute::cast_smem_ptr_to_uint(smem_a + s * kABytes), &a_map, kb * kTileK, m0, &full[s]);
        tma_load_2d(cute::cast_smem_ptr_to_uint(smem_b + s * T::kBBytes), &b_map, kb * kTileK, n0, &full[s]);
        tma_load_2d(cute::cast_smem_ptr_to_uint(smem_a_scale + s * kTokenTile), &a_scale_map, m0, kb, &full[s]);
      }
      if (++s == S) s = 0, phase ^= 1;
    }
    return;
  }

  // Math warpgroup. The weight scales of the whole K walk are in shared memory once scales_ready completes
  // (one broadcast read a block afterwards, where the fifteenth session's cp.async into each stage cost a
  // second arrival on every full barrier).
  if (resident_scales) Barrier::wait(scales_ready, 0);
  mark(2);
  if constexpr (kTimeline) Barrier::wait(&full[0], 0), mark(3);

  // Operand tiles per stage, K-major with the 128-byte swizzle the TMA boxes write.
  auto a_layout = tile_to_shape(GMMA::Layout_K_SW128_Atom<Fp8>{}, Shape<_64, Int<kTileK>, Int<S>>{});
  auto b_layout = tile_to_shape(GMMA::Layout_K_SW128_Atom<Fp8>{}, Shape<Int<TileN>, Int<kTileK>, Int<S>>{});
  Tensor sA = make_tensor(make_smem_ptr(reinterpret_cast<Fp8*>(smem_a)), a_layout);
  Tensor sB = make_tensor(make_smem_ptr(reinterpret_cast<Fp8*>(smem_b)), b_layout);
  typename T::Mma mma;
  auto thr = mma.get_thread_slice(threadIdx.x);
  Tensor tCrA = thr.make_fragment_A(thr.partition_A(sA));  // (MMA, 1, 4, S)
  Tensor tCrB = thr.make_fragment_B(thr.partition_B(sB));
  Tensor acc = partition_fragment_C(mma, Shape<_64, Int<TileN>>{});  // (MMA, 1, 1): TileN / 2 floats
  Tensor partial = make_fragment_like(acc);
  clear(acc);

  // Accumulator element i of this thread: row warp * 16 + lane / 4 + 8 * ((i / 2) % 2), column
  // 8 * (i / 4) + 2 * (lane % 4) + i % 2 (wgmma's m64nN accumulator layout).
  const int row = warp * 16 + lane / 4;
  // 8-column groups from `upper_group` on lie in the next 128-row weight scale block.
  const int upper_group = ((scale_block + 1) * 128 - n0) / 8;

  // Release of stage s once this thread's reads of it are done.
  const auto release = [&](const int s) TOK64_INLINE {
    if constexpr (kThreadRelease) {
      Barrier::arrive(&empty[s]);
    } else {
      __syncwarp();
      if (lane == 0) Barrier::arrive(&empty[s]);
    }
  };
  // K block kb on stage s (a constant inside the unrolled rounds below, so its descriptors and scale
  // addresses fold): wait for the stage, 4 wgmma into the fresh fragment, the token scale loads under them,
  // drain, release the stage, promote.
  // The fresh fragment into acc, each 8-column group with its weight scale's products: groups from `boundary` on
  // take the block above's. boundary: a constant (E24), or -1: upper_group at run time (a select per group).
  const auto promote = [&](auto boundary, const float s0_lo, const float s1_lo, const float s0_hi,
                           const float s1_hi) TOK64_INLINE {
    constexpr int kBoundary = decltype(boundary)::value;
    CUTLASS_PRAGMA_UNROLL
    for (int g = 0; g < TileN / 8; ++g) {
      const bool upper = !T::kOneWeightScale && g >= (kBoundary >= 0 ? kBoundary : upper_group);
      const float scale0 = upper ? s0_hi : s0_lo, scale1 = upper ? s1_hi : s1_lo;
      acc(4 * g + 0) = fmaf(partial(4 * g + 0), scale0, acc(4 * g + 0));
      acc(4 * g + 1) = fmaf(partial(4 * g + 1), scale0, acc(4 * g + 1));
      acc(4 * g + 2) = fmaf(partial(4 * g + 2), scale1, acc(4 * g + 2));
      acc(4 * g + 3) = fmaf(partial(4 * g + 3), scale1, acc(4 * g + 3));
    }
  };
  // f(Int<this tile's boundary group>): one uniform test per distinct boundary of the width (tile starts are
  // multiples of gcd(TileN, 128) modulo 128), unrolled by a fold (see for_each_index). The boundary is read through a
  // shuffle, so that ptxas sees one value per warp.
  const int tile_boundary = __shfl_sync(0xffffffffu, min(upper_group, T::kGroups), 0);
  const auto with_tile_boundary = [&](auto&& f) TOK64_INLINE {
    for_each_index([&](auto i) TOK64_INLINE {
      constexpr int kStart = decltype(i)::value * T::kStartStep;
      if constexpr (T::new_boundary(kStart))
        if (tile_boundary == T::boundary(kStart)) f(cute::Int<T::boundary(kStart)>{});
    }, std::make_integer_sequence<int, T::kStarts>{});
  };
  // boundary: Int<the boundary group> (E24), or Int<-1>: a select per group.
  auto block = [&](const int s, const uint32_t phase, const int kb, auto boundary) TOK64_INLINE {
    float2 w = make_float2(0.f, 0.f);
    if constexpr (kNoWeightScales)
      w = make_float2(1.f, 1.f);
    else if (resident_scales)
      w = make_float2(smem_b_scale[kb], T::kOneWeightScale ? 0.f : smem_b_scale[kMaxResidentKBlocks + kb]);
    else if (!kStageScales)
      w = make_float2(__ldg(b_scale_lo + kb), T::kOneWeightScale ? 0.f : __ldg(b_scale_hi + kb));
    Barrier::wait(&full[s], phase);
    if constexpr (!kMath) {
      release(s);
      return;
    }
    warpgroup_fence_operand(partial);
    warpgroup_arrive();
    mma.accumulate_ = GMMA::ScaleOut::Zero;
    CUTLASS_PRAGMA_UNROLL
    for (int k = 0; k < kTileK / 32; ++k) {
      cute::gemm(mma, tCrA(_, _, k, s), tCrB(_, _, k, s), partial);
      mma.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
    const float t0 = smem_a_scale[s * kTokenTile + row], t1 = smem_a_scale[s * kTokenTile + row + 8];
    if constexpr (kStageScales) w = smem_stage_b_scale[s];
    warpgroup_wait<0>();
    warpgroup_fence_operand(partial);
    release(s);
    const float s0_lo = t0 * w.x, s1_lo = t1 * w.x;
    float s0_hi = s0_lo, s1_hi = s1_lo;
    if constexpr (!T::kOneWeightScale) s0_hi = t0 * w.y, s1_hi = t1 * w.y;
    promote(boundary, s0_lo, s1_lo, s0_hi, s1_hi);
  };
  // Whole rounds of S blocks unrolled (stage indices constant), then the remaining blocks.
  const auto k_loop = [&](auto boundary) TOK64_INLINE {
    uint32_t phase = 0;
    int kb = 0;
    for (; kb + S <= p.k_blocks; kb += S, phase ^= 1) {
      CUTLASS_PRAGMA_UNROLL
      for (int s = 0; s < S; ++s) block(s, phase, kb + s, boundary);
    }
    for (int s = 0; kb < p.k_blocks; ++kb, ++s) block(s, phase, kb, boundary);
  };
  if constexpr (kBoundaryAtCompileTime) {
    with_tile_boundary(k_loop);  // one K loop per boundary the width can have
  } else {
    k_loop(cute::Int<-1>{});
  }
  mark(4);

  Out* d = static_cast<Out*>(p.d);
  const int q = lane % 4;
  if constexpr (kDirectStores) {
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(acc); i += 2) {
      const int r = m0 + row + 8 * ((i / 2) % 2);
      const int c = n0 + 8 * (i / 4) + 2 * q;
      if (r < p.m && c < p.n && (!kNoStores || acc(i) == -1.2345f))
        *reinterpret_cast<uint32_t*>(d + int64_t(r) * p.n + c) = pack_pair<Out>(acc(i), acc(i + 1));
    }
    mark(5);
    return;
  }
  // Lane q of a quad holds 2 columns of each 8-column group in two rows. Four groups transposed across the quad give
  // lane q group 4c + q whole: 16 bytes a lane, each warp store 8 rows x 64 bytes (whole 32-byte sectors, a quarter
  // of the store instructions of 4 bytes a lane). n % 8 == 0 and d is 16-byte aligned (plan.cpp's rejects() checks both), so a
  // group is in bounds or out as a whole.
  constexpr int kQuads = T::kGroups / 4;
  CUTLASS_PRAGMA_UNROLL
  for (int c = 0; c < kQuads; ++c) {
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) {
      uint32_t v[4];
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < 4; ++j) v[j] = pack_pair<Out>(acc(16 * c + 4 * j + 2 * h), acc(16 * c + 4 * j + 2 * h + 1));
      quad_transpose(v, q);
      const int r = m0 + row + 8 * h, col = n0 + 8 * (4 * c + q);
      if (r < p.m && col < p.n && (!kNoStores || v[0] == 0x12345u))
        *reinterpret_cast<uint4*>(d + int64_t(r) * p.n + col) = make_uint4(v[0], v[1], v[2], v[3]);
    }
  }
  // The last two groups where TileN % 32 == 16: one exchange with the neighbouring lane, 8 bytes a lane (an even lane
  // takes columns 2q..2q+3 of the first group, an odd lane 2q-2..2q+1 of the second).
  if constexpr (T::kGroups % 4 != 0) {
    static_assert(T::kGroups % 4 == 2, "8-column groups come in pairs (TileN % 16 == 0)");
    constexpr int g = T::kGroups - 2;
    const bool odd = q & 1;
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) {
      const uint32_t first = pack_pair<Out>(acc(4 * g + 2 * h), acc(4 * g + 2 * h + 1));
      const uint32_t second = pack_pair<Out>(acc(4 * g + 4 + 2 * h), acc(4 * g + 5 + 2 * h));
      const uint32_t got = __shfl_xor_sync(0xffffffffu, odd ? first : second, 1);
      const int r = m0 + row + 8 * h, col = n0 + 8 * (g + odd) + 2 * (q & 2);
      if (r < p.m && col < p.n && (!kNoStores || got == 0x12345u))
        *reinterpret_cast<uint2*>(d + int64_t(r) * p.n + col) = odd ? make_uint2(got, second) : make_uint2(first, got);
    }
  }
  mark(5);
}

PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      f = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// A row-major 2D map (inner extent `cols` contiguous) with a rows x cols box.
bool encode(CUtensorMap* map, CUtensorMapDataType type, const void* base, uint64_t cols, uint64_t rows,
            uint64_t row_bytes, uint32_t box_cols, uint32_t box_rows, CUtensorMapSwizzle swizzle) {
  const auto fn = encode_tiled();
  if (fn == nullptr) return false;
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {row_bytes};
  const cuuint32_t box[2] = {box_cols, box_rows};
  const cuuint32_t elem_strides[2] = {1, 1};
  // Out-of-bounds rows (M, N and the token scales past the tensors' ends) are filled with zeros.
  return fn(map, type, 2, const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <int TileN, class Out, int kProbe = 0>
cudaError_t launch_width(const Problem& p, bool pdl, cudaStream_t stream) {
  using T = Tile<TileN>;
  const uint64_t k_blocks = uint64_t(p.k) / kTileK;
  CUtensorMap a_map, b_map, a_scale_map;
  if (!encode(&a_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, p.a, p.k, p.m, p.k, kTileK, kTokenTile,
              CU_TENSOR_MAP_SWIZZLE_128B) ||
      !encode(&b_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, p.b, p.k, p.n, p.k, kTileK, TileN, CU_TENSOR_MAP_SWIZZLE_128B) ||
      !encode(&a_scale_map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, p.a_scale, p.a_scale_ld, k_blocks, p.a_scale_ld * 4,
              kTokenTile, 1, CU_TENSOR_MAP_SWIZZLE_NONE))
    return cudaErrorInvalidValue;
  const int64_t tiles = (p.m + kTokenTile - 1) / kTokenTile * ((p.n + TileN - 1) / TileN);
  if (tiles > std::numeric_limits<int32_t>::max()) return cudaErrorInvalidValue;
  const auto kernel = tok64_gemm<TileN, Out, kProbe>;
  // Every launch, as CUTLASS's adapter does: the attribute belongs to the current device's context.
  if (const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmem);
      e != cudaSuccess)
    return e;
  const int m_tiles = int((p.m + kTokenTile - 1) / kTokenTile);
  const Params params{p.b_scale, p.d, int(p.m), int(p.n), int(k_blocks), m_tiles};
  cudaLaunchAttribute programmatic;
  programmatic.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  programmatic.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(tiles));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = T::kSmem;
  cfg.stream = stream;
  cfg.attrs = &programmatic;
  cfg.numAttrs = pdl ? 1 : 0;
  const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, a_map, b_map, a_scale_map, params);
  return err != cudaSuccess ? err : cudaGetLastError();
}

template <int TileN>
cudaError_t launch_out(const Problem& p, bool pdl, cudaStream_t stream) {
  return p.out_bf16 ? launch_width<TileN, __nv_bfloat16>(p, pdl, stream)
                    : launch_width<TileN, __half>(p, pdl, stream);
}

}  // namespace

cudaError_t launch(const Problem& p, const Plan& plan, cudaStream_t stream) {
  switch (plan.tile_n) {
    case 16: return launch_out<16>(p, plan.pdl, stream);
    case 32: return launch_out<32>(p, plan.pdl, stream);
    case 48: return launch_out<48>(p, plan.pdl, stream);
    case 64: return launch_out<64>(p, plan.pdl, stream);
    case 80: return launch_out<80>(p, plan.pdl, stream);
    case 96: return launch_out<96>(p, plan.pdl, stream);
    case 112: return launch_out<112>(p, plan.pdl, stream);
    case 128: return launch_out<128>(p, plan.pdl, stream);
    case 144: return launch_out<144>(p, plan.pdl, stream);
    case 160: return launch_out<160>(p, plan.pdl, stream);
    case 192: return launch_out<192>(p, plan.pdl, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace blockfp8::gemm::sm90::tok64
