// Weight-only block-FP8 GEMV: the tile table (data, at the top) and the launchers.
//
//   out[m, n] = sum_kb (sum_{k in kb} x[m, k] * fp8(b[n, k])) * b_scale[n / 128, kb]
//
// x bf16/fp16 [m, k] (row stride x_stride), b fp8 e4m3 [n, k] contiguous, b_scale fp32
// [ceil(n / 128), ceil(k / 128)], out x's dtype [m, n] (row stride out_stride); see gemv.h.
// Compiled for every arch the extension builds (8.9, 9.0a, 12.0a): the kernels use SM80+
// features only. Unsupported: k % 16 != 0; the tensor-core rows also need k % 64 == 0.
// Reasons cite the seed measurements (ORT FP8 GEMV on the same H200) until our own replace them.
#include <algorithm>
#include <cstdint>

#include "../common/vector_rows.h"
#include "gemv.h"
#include "kernels.cuh"

namespace blockfp8::gemv {
namespace {

using Launcher = cudaError_t (*)(const Problem&, cudaStream_t);
using Check = const char* (*)(const Problem&);

template <int MT, int U, bool kMayPin>
cudaError_t launch_mma(const Problem& p, cudaStream_t s);
template <int R, int C, int U, bool kAnyAlign>
cudaError_t launch_fma(const Problem& p, cudaStream_t s);
template <int MT, int U>
cudaError_t launch_mma_ks32(const Problem& p, cudaStream_t s);
template <int MT>
cudaError_t launch_mma_lines(const Problem& p, cudaStream_t s);
template <int MT>
const char* mma_rejects(const Problem& p);
const char* lines_rejects(const Problem& p);
const char* small_grid_t16_rejects(const Problem& p);
const char* aligned_x_rejects(const Problem& p);
const char* wide_n_rejects(const Problem& p);
const char* accepts_all(const Problem&) { return nullptr; }

struct GemvRow {
  TileRow info;
  Check check;  // the row's own precondition, after the checks every row shares
  Launcher launch;
};

// Ordered: the first row with max_m >= M whose precondition holds wins.
constexpr GemvRow kRows[] = {
    {{"gemv_mma_t8_lines", 8,
      "t8 with the weight read in whole 128-byte lines staged through shared memory, where each warp walks >= 3 "
      "line chunks and the grid is not pinned: H200 0.91-0.97x t8's time at all 24 such points (6 shapes, M = 1..8), "
      "1.00-1.16x on the other 9 shapes (gemv/NOTES.md, 2026-11-30)"},
     &lines_rejects, &launch_mma_lines<1>},
    {{"gemv_mma_t8", 8,
      "tensor-core mma, one 8-token tile, 2 windows in flight per warp: H200 full linear 1.57x the floor at "
      "M = 1 (geomean of 15 shapes, best peer 2.16x), time flat from M = 1 to 8 (gemv/NOTES.md)"},
     &mma_rejects<1>, &launch_mma<1, 2, true>},
    {{"gemv_mma_t16_ks32", 16,
      "t16's two 8-token tiles in one 32-warp block per SM, where the grid has <= 1 block per SM (N <= 16 x "
      "SMs): twice the loads in flight; H200 2112x7168 at M = 16 7.39 us vs t16's 9.28 (gemv/NOTES.md)"},
     &small_grid_t16_rejects, &launch_mma_ks32<2, 1>},
    {{"gemv_mma_t16", 16,
      "tensor-core mma, two 8-token tiles for M = 9..16, 1 window in flight (2 blocks per SM): H200 1.2-1.45x "
      "t8's time at M = 16, slower than DeepGEMM on 7 of 15 shapes there (gemv/NOTES.md)"},
     &mma_rejects<2>, &launch_mma<2, 1, false>},
    {{"gemv_fma_r1_c4_u4", 1,
      "M = 1 without the mma preconditions: 4 columns x 4 loads in flight per lane took 8192x2048 from 2.3 to "
      "3.1 TB/s on H200 (seed 000 sec 5.4); needs N >= 4096 to fill the GPU"},
     &wide_n_rejects, &launch_fma<1, 4, 4, false>},
    {{"gemv_fma_r4_c2_u2", 4,
      "M <= 4 without the mma preconditions: x widened once per row and reused by 2 columns made "
      "ColsPerWarp pay at M > 1 (seed 000 sec 6.4)"},
     &aligned_x_rejects, &launch_fma<4, 2, 2, false>},
    {{"gemv_fma_r16_c1_u2", 16,
      "M <= 16 without the mma preconditions: all 16 tokens per pass so the weight is read once; FMA-issue "
      "bound (seed 000 sec 6: 240 instructions per 32 weight bytes at M = 4)"},
     &aligned_x_rejects, &launch_fma<16, 1, 2, false>},
    {{"gemv_fma_r8_c1_u2_anym", kUnboundedM,
      "any valid problem (any M, K % 16 == 0, x 2-byte aligned): 8-token passes over M, each re-reading the "
      "weight; the correctness fallback"},
     &accepts_all, &launch_fma<8, 1, 2, true>},
};
constexpr int kNumRows = int(sizeof(kRows) / sizeof(kRows[0]));
static_assert(kRows[kNumRows - 1].info.max_m == kUnboundedM, "the last row must take any M");

constexpr int64_t kMaxDim = int64_t(1) << 30;  // kernels index with 32-bit ints

bool x_rows_aligned(const Problem& p) { return rows_16byte_aligned(p.x, p.m, p.x_stride); }

const char* shared_rejects(const Problem& p) {
  if (p.m < 0 || p.n < 0 || p.k < 0) return "M, N and K must be >= 0";
  if (p.m >= kMaxDim || p.n >= kMaxDim || p.k >= kMaxDim) return "M, N and K must be below 2^30 (32-bit indexing)";
  if (p.k % 16 != 0) return "K must be a multiple of 16 (16-byte weight loads)";
  if (p.m > 1 && p.x_stride < p.k) return "x_stride must be >= K";
  if (p.m > 1 && p.out_stride < p.n) return "out_stride must be >= N";
  if (reinterpret_cast<uintptr_t>(p.b) % 16 != 0) return "b must be 16-byte aligned";
  if (reinterpret_cast<uintptr_t>(p.x) % 2 != 0 || reinterpret_cast<uintptr_t>(p.out) % 2 != 0)
    return "x and out must be 2-byte aligned";
  return nullptr;
}

const char* aligned_x_rejects(const Problem& p) {
  return x_rows_aligned(p) ? nullptr : kRowsNot16ByteAligned;
}

const char* wide_n_rejects(const Problem& p) {
  if (p.n < 4096) return "N < 4096: 4-column warps leave too few warps to fill the GPU (seed 000 sec 5.3)";
  return aligned_x_rejects(p);
}

template <int MT>
const char* mma_rejects(const Problem& p) {
  if (p.m > MT * kMmaTokens) return MT == 1 ? "M > 8: one 8-token mma tile" : "M > 16: two 8-token mma tiles";
  if (p.k % kWindow != 0) return "K must be a multiple of 64 (permuted 64-wide mma K windows)";
  if (p.k >= (int64_t(1) << 28)) return "K must be below 2^28 (32-bit offset between a lane's two weight rows)";
  return aligned_x_rejects(p);
}

// Where the whole-line row measured faster than t8 (H200, gemv/NOTES.md): whole 128-wide chunks
// (one scale block each), at least kLinesMinChunks of them per warp (with fewer, e.g. 4096x4096 at
// 2 per warp, it tied or lost), and not on the pinned grids, where t8 keeps 3 blocks per SM and
// the staged row's shared memory and registers allow 2 (1.07-1.16x t8's time there).
constexpr int kLinesMinChunks = 3;

const char* lines_rejects(const Problem& p) {
  if (const char* why = mma_rejects<1>(p)) return why;
  if (p.k % kBlock != 0) return "K must be a multiple of 128 (whole 128-byte weight lines per warp step)";
  if (p.k / kBlock < int64_t(kLinesMinChunks) * ksplit(p.n))
    return "fewer than 3 128-wide K chunks per warp: the staging does not pay off there (t8 is as fast)";
  if (pins_residency((p.n + kMmaCols - 1) / kMmaCols, p.sm_count, ksplit(p.n), 1))
    return "a grid t8 pins at 3 blocks per SM: t8 is faster there";
  return nullptr;
}

// The 32-warp block pays off only while the 16-warp grid leaves SMs with one block or none; above
// that, two 16-warp blocks per SM hold as many warps and t16 measured faster on every such shape.
const char* small_grid_t16_rejects(const Problem& p) {
  if (const char* why = mma_rejects<2>(p)) return why;
  if ((p.n + kMmaCols - 1) / kMmaCols > p.sm_count)
    return "N > 16 x SMs: more than one 16-column tile per SM, where t16's two 16-warp blocks per SM are faster";
  return nullptr;
}

template <typename T>
Args<T> args(const Problem& p) {
  return Args<T>{static_cast<const T*>(p.x), p.b, p.b_scale, static_cast<T*>(p.out), int(p.m), int(p.n), int(p.k),
                 p.x_stride, p.out_stride};
}

template <int R, int C, int U, bool kAnyAlign>
cudaError_t launch_fma(const Problem& p, cudaStream_t s) {
  const int64_t cols_per_block = int64_t(C) * kFmaWarps;
  // grid.y strides over M inside the kernel, so capping it at the hardware limit is enough.
  const dim3 grid(unsigned((p.n + cols_per_block - 1) / cols_per_block),
                  unsigned(std::min<int64_t>((p.m + R - 1) / R, 65535)));
  if (p.bf16)
    fma_kernel<R, C, U, kAnyAlign, __nv_bfloat16><<<grid, 32 * kFmaWarps, 0, s>>>(args<__nv_bfloat16>(p));
  else
    fma_kernel<R, C, U, kAnyAlign, __half><<<grid, 32 * kFmaWarps, 0, s>>>(args<__half>(p));
  return cudaGetLastError();
}

// U: windows in flight per warp. Little's law: 4.8 TB/s x ~1 us of latency over 132 SMs needs
// ~36 KB of weight requests outstanding per SM; a window is 1 KB per warp. One token tile:
// U = 2 at 62-64 registers keeps 2 blocks of 16 warps resident (64 KB in flight). Two tiles:
// U = 2 needs 84-90 registers (1 block per SM), U = 1 needs 52 (2 blocks, 32 KB in flight and
// twice the warps to hide the x loads and the reduction), so the selected two-tile row takes U = 1.
// The pinned entry point must fit 40 registers with one token tile: one window in flight.
constexpr int kPinnedUnroll = 1;

template <int MT, int U, bool kMayPin, typename T>
void launch_mma_t(const Problem& p, cudaStream_t s) {
  const Args<T> a = args<T>(p);
  const int64_t tiles = (p.n + kMmaCols - 1) / kMmaCols;
  const unsigned grid = unsigned(tiles);
  if (ksplit(p.n) == 8) {
    mma_kernel<8, MT, U, T><<<grid, 32 * 8, 0, s>>>(a);
    return;
  }
  if constexpr (kMayPin && MT == 1) {
    if (pins_residency(tiles, p.sm_count, 16, MT)) {
      mma_kernel_pinned<kPinnedUnroll, T><<<grid, 32 * 16, 0, s>>>(a);
      return;
    }
  }
  mma_kernel<16, MT, U, T><<<grid, 32 * 16, 0, s>>>(a);
}

template <int MT, int U, bool kMayPin>
cudaError_t launch_mma(const Problem& p, cudaStream_t s) {
  if (p.bf16)
    launch_mma_t<MT, U, kMayPin, __nv_bfloat16>(p, s);
  else
    launch_mma_t<MT, U, kMayPin, __half>(p, s);
  return cudaGetLastError();
}

template <int MT, int U>
cudaError_t launch_mma_ks32(const Problem& p, cudaStream_t s) {
  const unsigned grid = unsigned((p.n + kMmaCols - 1) / kMmaCols);
  if (p.bf16)
    mma_kernel_ks32<MT, U, __nv_bfloat16><<<grid, 32 * 32, 0, s>>>(args<__nv_bfloat16>(p));
  else
    mma_kernel_ks32<MT, U, __half><<<grid, 32 * 32, 0, s>>>(args<__half>(p));
  return cudaGetLastError();
}

template <int MT>
cudaError_t launch_mma_lines(const Problem& p, cudaStream_t s) {
  const unsigned grid = unsigned((p.n + kMmaCols - 1) / kMmaCols);
  const bool bf16 = p.bf16;
  if (ksplit(p.n) == 8) {
    if (bf16) mma_lines_kernel<8, MT, __nv_bfloat16><<<grid, 32 * 8, 0, s>>>(args<__nv_bfloat16>(p));
    else mma_lines_kernel<8, MT, __half><<<grid, 32 * 8, 0, s>>>(args<__half>(p));
  } else {
    if (bf16) mma_lines_kernel<16, MT, __nv_bfloat16><<<grid, 32 * 16, 0, s>>>(args<__nv_bfloat16>(p));
    else mma_lines_kernel<16, MT, __half><<<grid, 32 * 16, 0, s>>>(args<__half>(p));
  }
  return cudaGetLastError();
}

}  // namespace

int num_rows() { return kNumRows; }

const TileRow& row(int i) { return kRows[i].info; }

const char* rejects(int i, const Problem& p) {
  if (i < 0 || i >= kNumRows) return "row index out of range";
  if (const char* why = shared_rejects(p)) return why;
  return kRows[i].check(p);
}

int select(const Problem& p) {
  return first_row_taking(kRows, kNumRows, p.m, [&](int i) { return rejects(i, p); });
}

cudaError_t launch(int i, const Problem& p, cudaStream_t s) {
  if (rejects(i, p) != nullptr) return cudaErrorInvalidValue;
  if (p.m == 0 || p.n == 0) return cudaSuccess;
  return kRows[i].launch(p, s);
}

}  // namespace blockfp8::gemv
