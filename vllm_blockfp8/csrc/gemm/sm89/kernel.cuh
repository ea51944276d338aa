// SM89 (Ada) W8A8 block-FP8 GEMM on mma.sync, one kernel template for every row of table.h.
//
//   D[m, n] = sum_kb (sum_{k in block kb} A[m, k] * B[n, k]) * SFA[m, kb] * SFB[n / 128, kb]
//
// Layouts (gemm.h): A fp8 e4m3 [m, k] and B fp8 e4m3 [n, k], both K-major; SFA fp32 M-major (a_scale[kb * ld + m]);
// SFB fp32 [ceil(n / 128), k / 128]; D bf16 / fp16 [m, n] row-major.
// Arch: mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 exists from sm_89; the units are compiled for sm_89 and
// sm_90a (so the H200 runs the rows when the SM89 table is forced).
//
// How it works. A CTA owns a BM x 128 output tile (BM tokens, one 128-row weight-scale block, so SFB is one value
// per CTA per K block). K runs in 128-deep stages (one activation-scale group) through a STAGES-deep cp.async ring:
// A [BM][128 B] and B [128][128 B] per stage, each 128-byte row split into eight 16-byte chunks stored at chunk
// c ^ (row % 8), so the 8 row addresses of every ldmatrix phase, and every cp.async, hit 8 distinct bank groups.
// A K-major fp8 operand is, byte pair for byte pair, the f16 m16n8k16 operand with 32 bytes of K per row, so
// ldmatrix (b16 view) loads both fragments exactly as in the f16 case. Each warp owns a (BM / WM) x (128 / WN)
// subtile; per K block it accumulates 4 k32 MMAs into a fresh fp32 partial and promotes it ONCE:
// acc += partial * (SFA[row][kb] * SFB[n / 128][kb]), the scales read once per K block per thread (issued before
// the MMAs so their latency hides under them). Promoting per k32 slice instead keeps two fragments per slice live and
// spills (the Ada CUTLASS write-up in shared/seeds), and confining the tensor core's accumulation to one block is
// what keeps long K accurate.
// Tile order: tiles are numbered in groups of group_m token tiles; a group walks N with its token tiles adjacent,
// so CTAs running together share each weight tile in L2.
// K slices (gridDim.z > 1): slice z walks K blocks [z * per_slice, ...) and stores fp32 partials [z][m][n];
// sum_slices_kernel adds them in slice order (deterministic) and converts.
// Ragged M and N: rows past m / n are zero-filled by cp.async (src-size 0) and never stored; SFA rows past m read
// row m - 1. Any n >= 1: pairs are stored as one 32-bit word where n is even, else element by element.
// Unsupported: k % 128 != 0, unaligned (16-byte) A / B / D, m, n or k past int32 (plan.cpp's rejects()).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "../../common/convert.cuh"
#include "../../common/sm80.cuh"

namespace blockfp8::gemm::sm89 {

struct Params {
  const uint8_t* a;
  const float* a_scale;
  int64_t a_scale_ld;
  const uint8_t* b;
  const float* b_scale;
  void* d;
  float* partials;  // [gridDim.z][m][n] where gridDim.z > 1
  int m, n, k;
  int group_m;      // token tiles per group of the tile order
  int per_slice;    // K blocks per slice
};

constexpr int kBlockK = 128;  // K per stage = one scale group = bytes per smem row

// d += A (16x32 e4m3, row) * B (32x8 e4m3, col), fp32 accumulate.
__device__ __forceinline__ void mma_e4m3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Byte offset of 16-byte chunk c (0..7) of row r in a swizzled [rows][128 B] tile.
__device__ __forceinline__ int swz(int r, int c) { return r * kBlockK + 16 * (c ^ (r & 7)); }

// Stores the pair (x, y) at (row, col), (row, col + 1): guarded per element; one 32-bit store where both exist and n
// is even (then row * n + col is even: 4-byte aligned).
template <typename T>
__device__ __forceinline__ void store_pair(T* d, int n, int row, int col, float x, float y) {
  T* p = d + int64_t(row) * n + col;
  if ((n & 1) == 0 && col + 1 < n) {
    *reinterpret_cast<uint32_t*>(p) = pack_pair<T>(x, y);
  } else {
    if (col < n) p[0] = from_float<T>(x);
    if (col + 1 < n) p[1] = from_float<T>(y);
  }
}
__device__ __forceinline__ void store_pair(float* d, int n, int row, int col, float x, float y) {
  float* p = d + int64_t(row) * n + col;
  if ((n & 1) == 0 && col + 1 < n) {
    *reinterpret_cast<float2*>(p) = make_float2(x, y);
  } else {
    if (col < n) p[0] = x;
    if (col + 1 < n) p[1] = y;
  }
}

template <int BM, int BN, int WM, int WN, int STAGES, typename OutT>
__global__ void __launch_bounds__(32 * WM * WN, 1) gemm_kernel(const Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  constexpr int kThreads = 32 * WM * WN;
  constexpr int kWarpM = BM / WM, kWarpN = BN / WN;
  constexpr int MT = kWarpM / 16, NT = kWarpN / 8;  // m16 and n8 MMA tiles per warp
  constexpr int kStageBytes = (BM + BN) * kBlockK;
  static_assert(BN == 128, "one weight-scale block per CTA: SFB is one value per K block");
  static_assert(kWarpM % 16 == 0 && kWarpN % 16 == 0, "ldmatrix.x4 loads 16 rows of A and two n8 tiles of B");
  static_assert((BM * 8) % kThreads == 0 && (BN * 8) % kThreads == 0, "every thread copies whole chunks");

  extern __shared__ __align__(128) uint8_t smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int wm = warp / WN, wn = warp % WN;

  // Grouped tile order (see the header).
  const int tiles_m = (p.m + BM - 1) / BM, tiles_n = (p.n + BN - 1) / BN;
  const int width = p.group_m * tiles_n;
  const int pid = blockIdx.x, first_m = pid / width * p.group_m;
  const int group_size = min(tiles_m - first_m, p.group_m);
  const int tm = first_m + (pid % width) % group_size, tn = (pid % width) / group_size;
  const int m0 = tm * BM, n0 = tn * BN;

  const int kblocks = p.k / kBlockK;
  const int kb0 = blockIdx.z * p.per_slice, kb1 = min(kblocks, kb0 + p.per_slice);
  const uint32_t smem0 = sm80::smem_addr(smem);

  auto load_stage = [&](int stage, int kb) {
    if (kb < kb1) {
      const uint32_t a_s = smem0 + stage * kStageBytes, b_s = a_s + BM * kBlockK;
      const int64_t k0 = int64_t(kb) * kBlockK;
#pragma unroll
      for (int i = 0; i < BM * 8 / kThreads; ++i) {
        const int id = tid + i * kThreads, r = id >> 3, c = id & 7;
        const bool in = m0 + r < p.m;
        sm80::cp_async16_zfill(a_s + swz(r, c), p.a + (in ? int64_t(m0 + r) * p.k + k0 + 16 * c : 0), in ? 16 : 0);
      }
#pragma unroll
      for (int i = 0; i < BN * 8 / kThreads; ++i) {
        const int id = tid + i * kThreads, r = id >> 3, c = id & 7;
        const bool in = n0 + r < p.n;
        sm80::cp_async16_zfill(b_s + swz(r, c), p.b + (in ? int64_t(n0 + r) * p.k + k0 + 16 * c : 0), in ? 16 : 0);
      }
    }
    sm80::cp_async_commit();  // an empty group past the end keeps the wait counts uniform
  };

  float acc[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.f;

  // This thread's accumulator rows (SFA rows), clamped into [0, m) for the reads.
  int scale_row[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) scale_row[mt][h] = min(m0 + wm * kWarpM + 16 * mt + g + 8 * h, p.m - 1);
  const float* sfb = p.b_scale + int64_t(tn) * kblocks;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) load_stage(s, kb0 + s);

  for (int kb = kb0; kb < kb1; ++kb) {
    const int stage = (kb - kb0) % STAGES;
    sm80::cp_async_wait<STAGES - 2>();
    __syncthreads();  // stage kb landed for every thread; every warp is done with the stage refilled next
    load_stage((kb - kb0 + STAGES - 1) % STAGES, kb + STAGES - 1);

    // This block's scales, read once and combined per row: sfa * sfb.
    const float sb = __ldg(sfb + kb);
    float scale[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) scale[mt][h] = __ldg(p.a_scale + kb * p.a_scale_ld + scale_row[mt][h]);

    float part[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) part[mt][nt][i] = 0.f;

    const uint32_t a_s = smem0 + stage * kStageBytes, b_s = a_s + BM * kBlockK;
    // Not unrolled: unrolled, ptxas hoists all four slices' fragments next to the partial and the accumulator
    // (255 registers and spills on sm_90a); each slice still issues MT x NT independent MMAs.
#pragma unroll 1
    for (int kk = 0; kk < kBlockK / 32; ++kk) {  // k32 slices: chunks 2 kk, 2 kk + 1
      uint32_t af[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int r = wm * kWarpM + 16 * mt + (lane & 7) + 8 * ((lane >> 3) & 1);
        sm80::ldmatrix_x4(af[mt], a_s + swz(r, 2 * kk + (lane >> 4)));
      }
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        uint32_t bf[4];  // b0, b1 of n-tile 2 np, then of 2 np + 1
        const int r = wn * kWarpN + 16 * np + (lane & 7) + 8 * (lane >> 4);
        sm80::ldmatrix_x4(bf, b_s + swz(r, 2 * kk + ((lane >> 3) & 1)));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_e4m3(part[mt][2 * np], af[mt], bf[0], bf[1]);
          mma_e4m3(part[mt][2 * np + 1], af[mt], bf[2], bf[3]);
        }
      }
    }

    // Promotion, once per K block: one FFMA per accumulator element.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const float s0 = scale[mt][0] * sb, s1 = scale[mt][1] * sb;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        acc[mt][nt][0] = fmaf(part[mt][nt][0], s0, acc[mt][nt][0]);
        acc[mt][nt][1] = fmaf(part[mt][nt][1], s0, acc[mt][nt][1]);
        acc[mt][nt][2] = fmaf(part[mt][nt][2], s1, acc[mt][nt][2]);
        acc[mt][nt][3] = fmaf(part[mt][nt][3], s1, acc[mt][nt][3]);
      }
    }
  }
  sm80::cp_async_wait<0>();

  // Epilogue: c0, c1 at (row g, cols 2t, 2t + 1), c2, c3 at row g + 8; rows past m and columns past n not stored.
  const bool sliced = gridDim.z > 1;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = m0 + wm * kWarpM + 16 * mt + g + 8 * h;
      if (row >= p.m) continue;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int col = n0 + wn * kWarpN + 8 * nt + 2 * t;
        if (col >= p.n) continue;
        if (sliced)
          store_pair(p.partials + int64_t(blockIdx.z) * p.m * p.n, p.n, row, col, acc[mt][nt][2 * h],
                     acc[mt][nt][2 * h + 1]);
        else
          store_pair(static_cast<OutT*>(p.d), p.n, row, col, acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
      }
    }
#endif
}

// Sums the K slices' fp32 partials in slice order (bitwise reproducible) and converts to the output type.
template <typename OutT>
__global__ void sum_slices_kernel(const float* partials, OutT* d, int64_t elements, int slices) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < elements;
       e += int64_t(gridDim.x) * blockDim.x) {
    float sum = 0.f;
    for (int s = 0; s < slices; ++s) sum += partials[s * elements + e];
    d[e] = from_float<OutT>(sum);
  }
}

}  // namespace blockfp8::gemm::sm89
