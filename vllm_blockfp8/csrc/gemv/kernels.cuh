// Weight-only block-FP8 decode GEMV kernels (bodies; the table and launchers are in sm80.cu).
//
//   out[m, n] = sum_kb (sum_{k in kb} x[m, k] * fp8(b[n, k])) * b_scale[n / 128, kb]
//
// Layouts: x 16-bit [m, k] (row stride x_stride), b fp8 e4m3 [n, k] contiguous, b_scale fp32
// [ceil(n / 128), ceil(k / 128)] contiguous, out x's dtype [m, n] (row stride out_stride).
// Arch: SM80+ instructions only (mma.sync m16n8k16, ld.global.nc.L1::no_allocate); the paired
// cvt.rn.f16x2.e4m3x2 is native from SM89 (older archs get cuda_fp8.h's emulation).
// Numerics: e4m3 -> f16 and -> bf16 are exact, 16-bit products are exact in fp32, accumulation
// is fp32, and each lane's (or warp's) partial sum over one 128-wide K block is multiplied by
// its block scale once. Unsupported: k % 16 != 0 (both), k % 64 != 0 or m > 16 (tensor core).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "../common/convert.cuh"
#include "../common/sm80.cuh"

namespace blockfp8::gemv {

constexpr int kBlock = 128;    // edge of a scale block, in N and in K
constexpr int kFmaWarps = 4;   // warps per FMA block
constexpr int kChunk = 16;     // K elements per lane per weight load (16 bytes of fp8)
constexpr int kMmaCols = 16;   // output columns per tensor-core tile (the mma M extent)
constexpr int kMmaTokens = 8;  // tokens per mma n-tile (the mma N extent)
constexpr int kWindow = 64;    // K per permuted window: one 16-byte load per lane feeds 4 mma k-steps

template <typename T>
struct Args {
  const T* x;
  const uint8_t* b;
  const float* b_scale;
  T* out;
  int m, n, k;
  int64_t x_stride, out_stride;
};

namespace detail {

using sm80::bf16x2_to_float2;
using sm80::bit_cast;
using sm80::f16x2_to_float2;
using sm80::load_weight;
using sm80::load_x8;
using sm80::load_x8_unaligned;
using sm80::mma16816;
using sm80::word;
using sm80::x2_to_float2;

// Two e4m3 (low byte = lower k) -> f16x2 bits with one cvt.rn.f16x2.e4m3x2; exact.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t two) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), __NV_E4M3);
  return uint32_t(h.x) | (uint32_t(h.y) << 16);
}

// Two e4m3 -> the mma A-operand pair in T. For bf16 the route is e4m3 -> f16 -> f32 -> bf16:
// every step is exact, since an e4m3 value has 4 significant bits and a normal f16 exponent,
// so the f32 has 16 zero low bits and its high half IS the bf16: a byte permute (ALU pipe)
// packs the pair instead of a second conversion instruction.
template <typename T>
__device__ __forceinline__ uint32_t e4m3x2_to(uint32_t two);
template <>
__device__ __forceinline__ uint32_t e4m3x2_to<__half>(uint32_t two) { return e4m3x2_to_f16x2(two); }
template <>
__device__ __forceinline__ uint32_t e4m3x2_to<__nv_bfloat16>(uint32_t two) {
  const float2 f = f16x2_to_float2(e4m3x2_to_f16x2(two));
  return __byte_perm(__float_as_uint(f.x), __float_as_uint(f.y), 0x7632);
}

}  // namespace detail

// ------------------------------------------------------------------------------------------
// FMA kernel: one warp per C output columns, R tokens at a time (grid.y strides over M).
// Lane l reads the 16-byte chunks k = 16 l + 512 i of each column, so a warp load covers 512
// contiguous bytes and every chunk lies inside one 128-wide K block: the lane's partial sum of a
// chunk is its whole share of that block, and the block scale multiplies it once. U steps of
// loads are issued before any is consumed (memory-level parallelism, seed 000 sec 5). x is
// widened to fp32 once per row per chunk and reused for all C columns (seed 000 sec 6.4).
// kAnyAlign: x rows may be only 2-byte aligned (scalar x loads when they are not 16-byte).
// ------------------------------------------------------------------------------------------
template <int R, int C, int U, bool kAnyAlign, typename T>
__global__ void fma_kernel(const Args<T> a) {
  static_assert(kBlock % C == 0, "a warp's columns must share one 128-row scale block");
  static_assert(kBlock % kChunk == 0, "a lane's chunk must not straddle a scale block");
  // Pre-issuing x as well only pays while it stays cheap in registers (R * U uint4 pairs).
  constexpr bool kPreloadX = R * U <= 8;
  constexpr int kStep = 32 * kChunk;  // K covered by one warp-wide load

  const int lane = threadIdx.x & 31;
  const int col0 = (blockIdx.x * kFmaWarps + (threadIdx.x >> 5)) * C;
  if (col0 >= a.n) return;  // warp-uniform, and the kernel has no block-level barrier
  const int kblocks = (a.k + kBlock - 1) / kBlock;
  const float* srow = a.b_scale + int64_t(col0 / kBlock) * kblocks;
  const uint8_t* wrow[C];
#pragma unroll
  for (int c = 0; c < C; ++c) wrow[c] = a.b + int64_t(min(col0 + c, a.n - 1)) * a.k;
  const bool x_vec = !kAnyAlign || ((reinterpret_cast<uintptr_t>(a.x) & 15) == 0 && (a.x_stride & 7) == 0);

  for (int m0 = blockIdx.y * R; m0 < a.m; m0 += gridDim.y * R) {
    const int rows = min(R, a.m - m0);
    // Rows past M re-read row M - 1 (in bounds, no branch in the load phase) and are not stored.
    const T* xrow0 = a.x + int64_t(m0) * a.x_stride;
    auto xrow = [&](int r) { return xrow0 + int64_t(min(r, rows - 1)) * a.x_stride; };
    auto load_x = [&](const T* p) { return x_vec ? detail::load_x8(p) : detail::load_x8_unaligned(p); };

    float acc[R][C];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int c = 0; c < C; ++c) acc[r][c] = 0.f;

    for (int k0 = 0; k0 < a.k; k0 += U * kStep) {
      uint4 w[U][C];
      uint4 xv[kPreloadX ? U : 1][kPreloadX ? R : 1][2];
      float s[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int kk = k0 + u * kStep + lane * kChunk;
        if (kk < a.k) {
#pragma unroll
          for (int c = 0; c < C; ++c) w[u][c] = detail::load_weight(wrow[c] + kk);
          s[u] = __ldg(srow + kk / kBlock);
          if constexpr (kPreloadX) {
#pragma unroll
            for (int r = 0; r < R; ++r) {
              xv[u][r][0] = load_x(xrow(r) + kk);
              xv[u][r][1] = load_x(xrow(r) + kk + 8);
            }
          }
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int kk = k0 + u * kStep + lane * kChunk;
        if (kk >= a.k) continue;
        auto x_chunk = [&](int r, int half) {
          if constexpr (kPreloadX) return xv[u][r][half];
          else return load_x(xrow(r) + kk + 8 * half);
        };
        if constexpr (R >= C) {
          // Weights widened once per column, then one row of x at a time.
          float wf[C][kChunk];
#pragma unroll
          for (int c = 0; c < C; ++c)
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              const uint32_t v = detail::word(w[u][c], q);
              const float2 lo = detail::f16x2_to_float2(detail::e4m3x2_to_f16x2(v));
              const float2 hi = detail::f16x2_to_float2(detail::e4m3x2_to_f16x2(v >> 16));
              wf[c][4 * q + 0] = lo.x, wf[c][4 * q + 1] = lo.y, wf[c][4 * q + 2] = hi.x, wf[c][4 * q + 3] = hi.y;
            }
#pragma unroll
          for (int r = 0; r < R; ++r) {
            if (r >= rows) break;
            float xf[kChunk];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const uint4 xc = x_chunk(r, h);
#pragma unroll
              for (int q = 0; q < 4; ++q) {
                const float2 f = detail::x2_to_float2<T>(detail::word(xc, q));
                xf[8 * h + 2 * q] = f.x, xf[8 * h + 2 * q + 1] = f.y;
              }
            }
#pragma unroll
            for (int c = 0; c < C; ++c) {
              float p = 0.f;
#pragma unroll
              for (int e = 0; e < kChunk; ++e) p = fmaf(xf[e], wf[c][e], p);
              acc[r][c] = fmaf(p, s[u], acc[r][c]);
            }
          }
        } else {
          // x widened once per row, then one weight column at a time.
          float xf[R][kChunk];
#pragma unroll
          for (int r = 0; r < R; ++r)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const uint4 xc = x_chunk(r, h);
#pragma unroll
              for (int q = 0; q < 4; ++q) {
                const float2 f = detail::x2_to_float2<T>(detail::word(xc, q));
                xf[r][8 * h + 2 * q] = f.x, xf[r][8 * h + 2 * q + 1] = f.y;
              }
            }
#pragma unroll
          for (int c = 0; c < C; ++c) {
            float wf[kChunk];
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              const uint32_t v = detail::word(w[u][c], q);
              const float2 lo = detail::f16x2_to_float2(detail::e4m3x2_to_f16x2(v));
              const float2 hi = detail::f16x2_to_float2(detail::e4m3x2_to_f16x2(v >> 16));
              wf[4 * q + 0] = lo.x, wf[4 * q + 1] = lo.y, wf[4 * q + 2] = hi.x, wf[4 * q + 3] = hi.y;
            }
#pragma unroll
            for (int r = 0; r < R; ++r) {
              if (r >= rows) break;
              float p = 0.f;
#pragma unroll
              for (int e = 0; e < kChunk; ++e) p = fmaf(xf[r][e], wf[e], p);
              acc[r][c] = fmaf(p, s[u], acc[r][c]);
            }
          }
        }
      }
    }

    // Butterfly sum across the warp; lane (r * C + c) % 32 stores element (r, c).
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int c = 0; c < C; ++c) {
        float v = acc[r][c];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == (r * C + c) % 32 && r < rows && col0 + c < a.n)
          a.out[int64_t(m0 + r) * a.out_stride + col0 + c] = blockfp8::from_float<T>(v);
      }
  }
}

// ------------------------------------------------------------------------------------------
// Tensor-core kernel: a block of KS warps computes 16 output columns x 8 * MT tokens.
// The weight is the mma A operand (16 columns on the mma M extent), x the B operand (tokens on
// the mma N extent). Inside a 64-wide K window the K axis is permuted (seed 000 sec 6.1):
//   mma k-slot of step j   2t, 2t+1  -> k = 16t + 4j, 16t + 4j + 1
//                          2t+8, 2t+9 -> k = 16t + 4j + 2, 16t + 4j + 3
// so lane (g = lane / 4, t = lane % 4) loads bytes [16t, 16t + 16) of weight rows g and g + 8
// (one 16-byte load each, 4 lanes = 64 contiguous bytes of a row) and x elements [16t, 16t + 16)
// of token g, and word j of those loads feeds mma step j. K is a reduction axis, so permuting it
// in both operands leaves the sum unchanged. Warp w takes windows w, w + KS, ...; two windows
// make a 128-wide scale block, so each window's mma result is one partial sum of a block and is
// scaled once into the fp32 accumulator. 16 | 128, so a tile's columns share one scale row.
// The KS partial tiles are summed through shared memory in a fixed order (deterministic).
// ------------------------------------------------------------------------------------------
// One permuted 64-wide window on the tensor cores: 4 mma k-steps of the lane's two weight rows
// (wl: row g, wh: row g + 8) against MT 8-token tiles of x, then acc += window sum * its block
// scale (a window lies inside one 128-wide scale block).
template <int MT, typename T>
__device__ __forceinline__ void window_mma(const uint4& wl, const uint4& wh, const uint4 (&xv)[MT][2], float scale,
                                           float (&acc)[MT][4]) {
  float d[MT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < 4; ++i) d[mt][i] = 0.f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t lo = detail::word(wl, j), hi = detail::word(wh, j);
    const uint32_t a0 = detail::e4m3x2_to<T>(lo), a1 = detail::e4m3x2_to<T>(hi);
    const uint32_t a2 = detail::e4m3x2_to<T>(lo >> 16), a3 = detail::e4m3x2_to<T>(hi >> 16);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const uint32_t b0 = detail::word(xv[mt][j / 2], (2 * j) % 4);
      const uint32_t b1 = detail::word(xv[mt][j / 2], (2 * j) % 4 + 1);
      detail::mma16816<T>(d[mt][0], d[mt][1], d[mt][2], d[mt][3], a0, a1, a2, a3, b0, b1);
    }
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[mt][i] = fmaf(d[mt][i], scale, acc[mt][i]);
}

// The KS warps' partial 16 x 8*MT tiles summed through shared memory in a fixed order
// (deterministic), then stored by the first MT * 4 warps' lanes.
template <int KS, int MT, typename T>
__device__ __forceinline__ void reduce_store(const float (&acc)[MT][4], float (&partial)[KS][MT * 4][32],
                                             const Args<T>& a, int n0) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < 4; ++i) partial[warp][mt * 4 + i][lane] = acc[mt][i];
  __syncthreads();
  if (threadIdx.x < MT * 4 * 32) {
    const int e = threadIdx.x >> 5, ln = threadIdx.x & 31;
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < KS; ++w) sum += partial[w][e][ln];
    // Accumulator element i of lane ln: column g (+8 for i >= 2), token 2t + (i & 1) of tile mt.
    const int mt = e >> 2, i = e & 3;
    const int col = n0 + (ln >> 2) + (i >= 2 ? 8 : 0);
    const int tok = mt * kMmaTokens + 2 * (ln & 3) + (i & 1);
    if (col < a.n && tok < a.m) a.out[int64_t(tok) * a.out_stride + col] = blockfp8::from_float<T>(sum);
  }
}

// Where one lane of a KS-warp block of 16 output columns starts (every mma entry point). Columns
// past N re-read row N - 1 and tokens past M re-read token M - 1: in bounds, no branch in the
// loop, never stored. The pointers start at this warp's first window and step over KS windows
// per window, so every load in a loop uses an immediate offset.
template <int KS>
struct MmaLane {
  static_assert(KS % (kBlock / kWindow) == 0, "KS must keep a warp's windows at whole-block strides");
  static constexpr int kStride = KS * kWindow;                  // K between a warp's windows
  static constexpr int kScaleStride = KS / (kBlock / kWindow);  // scale blocks between them
  int lane, warp, g, n0, first, hi_delta;
  const uint8_t* w_lo;
  const float* sp;

  template <typename T>
  __device__ __forceinline__ explicit MmaLane(const Args<T>& a)
      : lane(threadIdx.x & 31), warp(threadIdx.x >> 5), g(lane >> 2), n0(blockIdx.x * kMmaCols),
        first(warp * kWindow + 16 * (lane & 3)) {
    const int row_lo = min(n0 + g, a.n - 1);
    w_lo = a.b + int64_t(row_lo) * a.k + first;
    // Row g + 8 as a 32-bit offset from row g (<= 8 K < 2^31: the mma rows reject K >= 2^28),
    // one register less than a second pointer under the pinned entry point's 40-register cap.
    hi_delta = (min(n0 + g + 8, a.n - 1) - row_lo) * a.k;
    // KS is even, so window w and window w + KS * u sit KS * u / 2 scale blocks apart.
    sp = a.b_scale + int64_t(n0 / kBlock) * ((a.k + kBlock - 1) / kBlock) + warp / (kBlock / kWindow);
  }
  template <typename T>
  __device__ __forceinline__ const T* x_row(const Args<T>& a, int token) const {
    return a.x + int64_t(min(token, a.m - 1)) * a.x_stride + first;
  }
  template <typename T>
  __device__ __forceinline__ int windows(const Args<T>& a) const {
    return (a.k / kWindow - warp + KS - 1) / KS;
  }
};

template <int KS, int MT, int U, typename T>
__device__ __forceinline__ void mma_body(const Args<T>& a) {
  __shared__ float partial[KS][MT * 4][32];
  const MmaLane<KS> ln(a);
  const int n0 = ln.n0, hi_delta = ln.hi_delta;
  const uint8_t* w_lo = ln.w_lo;
  const float* sp = ln.sp;
  const T* xp[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) xp[mt] = ln.x_row(a, mt * kMmaTokens + ln.g);
  constexpr int kStride = MmaLane<KS>::kStride;
  constexpr int kScaleStride = MmaLane<KS>::kScaleStride;

  float acc[MT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[mt][i] = 0.f;

  for (int left = ln.windows(a); left > 0; left -= U) {
    uint4 wl[U], wh[U], xv[U][MT][2];
    float s[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (u < left) {
        wl[u] = detail::load_weight(w_lo + u * kStride);
        wh[u] = detail::load_weight(w_lo + hi_delta + u * kStride);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          xv[u][mt][0] = detail::load_x8(xp[mt] + u * kStride);
          xv[u][mt][1] = detail::load_x8(xp[mt] + u * kStride + 8);
        }
        s[u] = __ldg(sp + u * kScaleStride);
      }
    }
    w_lo += U * kStride, sp += U * kScaleStride;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) xp[mt] += U * kStride;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (u >= left) break;
      window_mma<MT, T>(wl[u], wh[u], xv[u], s[u], acc);
    }
  }

  reduce_store<KS, MT, T>(acc, partial, a, n0);
}

// Plain entry point. No __launch_bounds__: declaring any replaced nvcc's implicit bounds and
// cost 8-warp blocks 1.05-1.08x on H200 (seed 003).
template <int KS, int MT, int U, typename T>
__global__ void mma_kernel(const Args<T> a) {
  mma_body<KS, MT, U, T>(a);
}

// Residency-pinned entry point for grids just past 2 blocks per SM (gemv.h, pins_residency):
// 3 resident 16-warp blocks need <= 42 registers, which the hint enforces.
template <int U, typename T>
__global__ void __launch_bounds__(32 * 16, 3) mma_kernel_pinned(const Args<T> a) {
  mma_body<16, 1, U, T>(a);
}

// 32-warp entry point (row gemv_mma_t16_ks32): one 1024-thread block per SM. For grids of at
// most one 16-warp block per SM (N <= 16 * sm_count, e.g. 2112 columns on 132 SMs) it doubles the
// warps, hence the weight requests in flight, per SM; ncu on the H200 showed that case stalled on
// global loads (long scoreboard 59% of cycles, 25% achieved occupancy). The bound is a
// correctness need here, not a tuning hint: 1024 threads launch only at <= 64 registers per thread.
template <int MT, int U, typename T>
__global__ void __launch_bounds__(32 * 32, 1) mma_kernel_ks32(const Args<T> a) {
  mma_body<32, MT, U, T>(a);
}

// Row gemv_mma_t8_lines: the t8 math (MT token tiles; only MT = 1 is in the table) with the weight
// read in whole 128-byte lines. The register kernel's lane mapping makes each warp load touch 8
// rows x 64 bytes, i.e. 8 half-used cache lines; the H200 read-pattern probe
// (dev/probes/gemv_read_probe.cu) found that pattern costs more L1 per byte than whole lines (with
// L1 shrunk by a shared-memory carve-out it ran at 1.4-2.1x a stream's time, whole lines at
// 1.05-1.2x). On the H200 this row is 3-9% faster than t8 where a warp walks >= 3 chunks.
// Here warp w takes 128-wide K chunks w, w + KS, ... (one scale block each). A chunk of the tile's
// 16 rows is 2 KB: 4 loads per lane, each covering 4 rows x 128 contiguous bytes (lane l: row
// l / 8 + 4i, bytes 16 (l % 8) ..), staged through the warp's own 2 KB of shared memory and read
// back in the mma lane mapping (row g and g + 8, bytes 16t of window h = 64h + 16t), i.e. the
// permuted windows 2c and 2c + 1 of the register kernel. Slots are XOR-swizzled by row parity
// (slot ^ 4 on odd rows) so both the line writes and the fragment reads are conflict-free.
// Needs K % 128 == 0 (whole chunks). Same weight bytes in flight per warp as t8 (2 KB).
template <int KS, int MT, typename T>
__global__ void mma_lines_kernel(const Args<T> a) {
  constexpr int kLine = 2 * kWindow;  // K per chunk: one cache line of each row, one scale block
  __shared__ uint4 staged[KS][kMmaCols * kLine / 16];
  __shared__ float partial[KS][MT * 4][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * kMmaCols;
  // Copy role: rows r0 + 4i (i < 4) of the tile, 16-byte slot q of each row's line.
  const int r0 = lane >> 3, q = lane & 7;
  const int row0 = min(n0 + r0, a.n - 1);
  const uint8_t* src = a.b + int64_t(row0) * a.k + int64_t(warp) * kLine + 16 * q;
  // Rows past N re-read row N - 1; offsets from row0 stay below 12 K < 2^32 (K < 2^28).
  uint32_t row_off[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) row_off[i] = uint32_t(min(n0 + r0 + 4 * i, a.n - 1) - row0) * uint32_t(a.k);
  uint4* mine = staged[warp];
  const int write_slot = r0 * 8 + (q ^ ((r0 & 1) << 2));  // copy i writes write_slot + 32 i
  const int read_slot = g * 8 + (t ^ ((g & 1) << 2));     // window 1: ^ 4; row g + 8: + 64
  const T* xp[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
    xp[mt] = a.x + int64_t(min(mt * kMmaTokens + g, a.m - 1)) * a.x_stride + warp * kLine + 16 * t;
  const float* sp = a.b_scale + int64_t(n0 / kBlock) * (a.k / kBlock) + warp;

  float acc[MT][4] = {};
  for (int chunk = warp; chunk < a.k / kLine; chunk += KS) {
    uint4 line[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) line[i] = detail::load_weight(src + row_off[i]);
    uint4 xv[2][MT][2];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        xv[h][mt][0] = detail::load_x8(xp[mt] + h * kWindow);
        xv[h][mt][1] = detail::load_x8(xp[mt] + h * kWindow + 8);
      }
    const float scale = __ldg(sp);
    __syncwarp();  // every lane has read the previous chunk's slots
#pragma unroll
    for (int i = 0; i < 4; ++i) mine[write_slot + 32 * i] = line[i];
    __syncwarp();
#pragma unroll
    for (int h = 0; h < 2; ++h)
      window_mma<MT, T>(mine[read_slot ^ (4 * h)], mine[(read_slot ^ (4 * h)) + 64], xv[h], scale, acc);
    src += KS * kLine, sp += KS;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) xp[mt] += KS * kLine;
  }
  reduce_store<KS, MT, T>(acc, partial, a, n0);
}

}  // namespace blockfp8::gemv
