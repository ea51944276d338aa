// W4A16 GEMM for NVFP4 weights on mma.sync (Ada; Hopper until a wgmma row exists; any SM80+ GPU):
//
//   out[m, n] = global_scale[n] * sum_k x[m, k] * e2m1(b[n, k]) * b_scale[n, k / 16]
//
// Layouts as fp4.h (the weight in either packing: PAIRED, decode.cuh). A block computes 32 * WN weight rows x 8 * NT * WM tokens over its share of K
// (gridDim.z splits K; split s writes fp32 partials that w4a16_reduce_kernel sums). K runs in
// 128-wide stages through a STAGES-deep cp.async ring: x [tokens][128] (16-bit), the packed weight
// [rows][64 bytes] and its scales [rows][8 bytes]. Each stage's weight is decoded ONCE by the whole
// block into a 16-bit tile [rows][128] in shared memory (never into global memory), so the token
// warps share the decode, and both mma operands then come from ldmatrix in natural K order.
// Warp (wn, wm) owns rows 32 wn .. 32 wn + 31 (two 16-row mma tiles, the A operand) and NT 8-token
// tiles (the B operand). Rows of both 16-bit tiles are 256 bytes with their 16-byte chunks
// XOR-swizzled by row % 8, so every ldmatrix phase and every cp.async / decode store hits 8
// distinct bank groups.
// Numerics: decode.cuh (every operand exact, fp32 accumulation, the global scale and bias once).
// Rows past N and tokens past M re-read row N - 1 / token M - 1 (never stored).
// Unsupported: k % 128 != 0, x rows not 16-byte aligned, b_scale not 8-byte aligned.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "../common/sm80.cuh"
#include "decode.cuh"
#include "gemv.cuh"

namespace blockfp8::fp4 {

constexpr int kStageK = 128;                  // K per pipeline stage
constexpr int kTileRowBytes = kStageK * 2;    // one row of a 16-bit tile (x, or the decoded weight)
constexpr int kPackedRowBytes = kStageK / 2;  // one weight row's stage of packed codes
constexpr int kScaleRowBytes = kStageK / kGroup;

template <int WN, int WM, int NT, int STAGES>
struct W4a16Tile {
  static constexpr int kRows = 32 * WN;
  static constexpr int kTokens = 8 * NT * WM;
  static constexpr int kThreads = 32 * WN * WM;
  static constexpr int kStageBytes = kTokens * kTileRowBytes + kRows * (kPackedRowBytes + kScaleRowBytes);
  static constexpr int kSmemBytes = STAGES * kStageBytes + kRows * kTileRowBytes;
};

// Byte offset of 16-byte chunk c (0..15) of row r in a swizzled 16-bit tile.
__device__ __forceinline__ int tile_offset(int r, int c) { return r * kTileRowBytes + 16 * (c ^ (r & 7)); }

// Shared memory per block on SM89 and SM120 (99 KB): bigger tiles are SM90 rows.
constexpr int kSmallGpuSmemBytes = 99 * 1024;

template <int WN, int WM, int NT, int STAGES, bool PAIRED, typename T>
__device__ __forceinline__ void w4a16_body(const Args<T>& a, float* partials) {
  using Tile = W4a16Tile<WN, WM, NT, STAGES>;
  static_assert(NT % 2 == 0, "x fragments load two 8-token tiles per ldmatrix.x4");
  extern __shared__ __align__(128) uint8_t smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int wn = warp % WN, wm = warp / WN;
  const int tok0 = blockIdx.x * Tile::kTokens, row0 = blockIdx.y * Tile::kRows;
  // This split's stages.
  const int stages_k = a.k / kStageK;
  const int per_split = (stages_k + gridDim.z - 1) / gridDim.z;
  const int kt0 = blockIdx.z * per_split, kt1 = min(stages_k, kt0 + per_split);
  const int64_t row_bytes = a.k / 2, row_scales = a.k / kGroup;

  uint8_t* const wtile = smem + STAGES * Tile::kStageBytes;  // decoded 16-bit weight
  auto x_tile = [&](int s) { return smem + s * Tile::kStageBytes; };
  auto packed_tile = [&](int s) { return x_tile(s) + Tile::kTokens * kTileRowBytes; };
  auto scale_tile = [&](int s) { return packed_tile(s) + Tile::kRows * kPackedRowBytes; };

  auto load_stage = [&](int s, int kt) {
    if (kt < kt1) {
      const int k0 = kt * kStageK;
      for (int id = tid; id < Tile::kTokens * 16; id += Tile::kThreads) {
        const int r = id >> 4, c = id & 15;
        sm80::cp_async16(x_tile(s) + tile_offset(r, c),
                         a.x + int64_t(min(tok0 + r, a.m - 1)) * a.x_stride + k0 + 8 * c);
      }
      for (int id = tid; id < Tile::kRows * 4; id += Tile::kThreads) {
        const int r = id >> 2, c = id & 3;
        sm80::cp_async16(packed_tile(s) + r * kPackedRowBytes + 16 * c,
                         a.b + min(row0 + r, a.n - 1) * row_bytes + k0 / 2 + 16 * c);
      }
      for (int r = tid; r < Tile::kRows; r += Tile::kThreads)
        sm80::cp_async8(scale_tile(s) + r * kScaleRowBytes,
                        a.b_scale + min(row0 + r, a.n - 1) * row_scales + k0 / kGroup);
    }
    sm80::cp_async_commit();  // an empty group past the end keeps the wait counts uniform
  };

  float acc[2][NT][4] = {};
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) load_stage(s, kt0 + s);

  for (int kt = kt0; kt < kt1; ++kt) {
    const int s = (kt - kt0) % STAGES;
    sm80::cp_async_wait<STAGES - 2>();
    __syncthreads();  // stage kt landed for every thread; the last mma phase is done with wtile
    load_stage((kt - kt0 + STAGES - 1) % STAGES, kt + STAGES - 1);

    // Decode: pair w of the stage is scale group w % 8 of row w / 8 (two words, elements 16 (w % 8) ..
    // + 15), so each group's scale is converted once.
    for (int w = tid; w < Tile::kRows * 8; w += Tile::kThreads) {
      const int r = w >> 3, grp = w & 7;
      const uint2 q = *reinterpret_cast<const uint2*>(packed_tile(s) + r * kPackedRowBytes + 8 * grp);
      uint32_t scale, unused;
      scale_pairs<T>(scale_tile(s)[r * kScaleRowBytes + grp], scale, unused);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t v[4];
        decode_scaled_in_order<PAIRED, T>(h ? q.y : q.x, scale, v);
        *reinterpret_cast<uint4*>(wtile + tile_offset(r, 2 * grp + h)) = make_uint4(v[0], v[1], v[2], v[3]);
      }
    }
    __syncthreads();  // the decoded tile is complete

    const uint8_t* xs = x_tile(s);
#pragma unroll
    for (int kk = 0; kk < kStageK / 16; ++kk) {
      uint32_t af[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const int r = 32 * wn + 16 * mt + (lane & 7) + 8 * ((lane >> 3) & 1);
        sm80::ldmatrix_x4(af[mt], wtile + tile_offset(r, 2 * kk + (lane >> 4)));
      }
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        uint32_t bf[4];  // b0, b1 of n-tile 2 np, then of 2 np + 1
        const int r = wm * NT * 8 + 16 * np + (lane & 7) + 8 * (lane >> 4);
        sm80::ldmatrix_x4(bf, xs + tile_offset(r, 2 * kk + ((lane >> 3) & 1)));
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float* d = acc[mt][2 * np + h];
            sm80::mma16816<T>(d[0], d[1], d[2], d[3], af[mt][0], af[mt][1], af[mt][2], af[mt][3], bf[2 * h],
                              bf[2 * h + 1]);
          }
      }
    }
  }
  sm80::cp_async_wait<0>();

#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int col = row0 + 32 * wn + 16 * mt + g + (i >= 2 ? 8 : 0);
        const int tok = tok0 + wm * NT * 8 + nt * 8 + 2 * t + (i & 1);
        if (col >= a.n || tok >= a.m) continue;
        if (gridDim.z == 1)
          store_out(a, tok, col, acc[mt][nt][i]);
        else
          partials[(int64_t(blockIdx.z) * a.m + tok) * a.n + col] = acc[mt][nt][i];
      }
}

template <int WN, int WM, int NT, int STAGES, bool PAIRED, typename T>
__global__ void __launch_bounds__(32 * WN * WM) w4a16_kernel(const Args<T> a, float* partials) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ != 900
  // Never launched off SM90 (w4a16_rejects: too little shared memory), so no body there.
  if constexpr (W4a16Tile<WN, WM, NT, STAGES>::kSmemBytes > kSmallGpuSmemBytes) return;
  else
#endif
    w4a16_body<WN, WM, NT, STAGES, PAIRED, T>(a, partials);
}

// Sums the K splits' fp32 partials in split order (deterministic) and applies the epilogue.
template <typename T>
__global__ void w4a16_reduce_kernel(const Args<T> a, const float* partials, int splits) {
  const int64_t total = int64_t(a.m) * a.n;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    float sum = 0.f;
    for (int s = 0; s < splits; ++s) sum += partials[s * total + e];
    store_out(a, int(e / a.n), int(e % a.n), sum);
  }
}

}  // namespace blockfp8::fp4
