// SM90 (sm_90a only) W4A16 GEMM for NVFP4 weights on wgmma, the decoded weight as the register A operand:
//
//   out[m, n] = global_scale[n] * sum_k x[m, k] * e2m1(b[n, k]) * e4m3(b_scale[n, k / 16]) (+ bias[n])
//
// Layouts as fp4.h (x 16-bit [m, k] row stride x_stride; b packed [n, k / 2] in the paired packing only:
// decode.cuh, reference.pair_nvfp4_weight; b_scale e4m3 [n, k / 16]). Swap-AB: the wgmma M extent is weight rows (64 per warpgroup), its N extent tokens.
// A CTA of two warpgroups (256 threads) computes 128 weight rows x TOK tokens (TOK = 64, 128, 256) over its share
// of K (gridDim.z splits K; split z writes fp32 partials that sm80.cu's w4a16_reduce_kernel sums).
// K runs in 64-wide stages through a cp.async ring (every thread copies; zero-fill past M and N):
//   x      [TOK][64] 16-bit, one 128-byte row per token, 16-byte chunk c of row r at chunk c ^ (r % 8): the
//          K-major 128-byte-swizzle layout the wgmma B descriptor reads (wgmma.cuh);
//   weight [128][32 bytes] packed codes, scales [128][4 bytes] (one e4m3 per k16 step of a row).
// Per k16 step each warp builds its A fragment (wgmma.cuh) from shared memory: lane (g, t) reads the step's two
// paired words of rows g and g + 8 of its 16 (elements 0-7 and 8-15) and takes pair t of each (elements 2t, 2t + 1
// and 2t + 8, 2t + 9: decode.cuh's paired_pair, a rotate-select-mask whose rotations the lane fixes once), and one
// HMUL2 by the row's scale makes each operand e2m1 * e4m3 * 2^-7, exact (decode.cuh). A k16 step is exactly one
// scale group, so each pair needs one scale.
// One wgmma per step and warpgroup, at most one in flight (wait_group 1): the next step's decode overlaps it.
// Shared-memory reuse: iteration i loads stage i + STAGES - 2 into the slot of stage i - 2, whose wgmma every
// warpgroup has retired (wait_group 1 after stage i - 1's first step) before the barrier that precedes the load.
// Epilogue: fp32 accumulators * global_scale * 2^7 (kUnbias) + bias in fp32, one rounding, masked stores; or the
// fp32 partials of a split. Numerics: decode.cuh (exact operands, fp32 accumulation).
// Unsupported: ModelOpt's packing (pair it at load), k % 64 != 0, x rows not 16-byte aligned, b_scale not 4-byte
// aligned, N > 65535 * 128, any GPU but SM90 (compute capability 9.0).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "../../common/convert.cuh"
#include "../../common/sm80.cuh"
#include "../decode.cuh"
#include "../gemv.cuh"
#include "wgmma.cuh"

namespace blockfp8::fp4::sm90 {

constexpr int kRows = 128;                 // weight rows per CTA: two warpgroups of 64
constexpr int kThreads = 256;
constexpr int kStageK = 64;                // K per stage: one 128-byte swizzle row of x per token
constexpr int kXRowBytes = kStageK * 2;    // 128
constexpr int kWRowBytes = kStageK / 2;    // 32 packed bytes of a weight row
constexpr int kSRowBytes = kStageK / kGroup;  // 4 scales of a weight row
constexpr int kSteps = kStageK / 16;       // k16 steps (wgmma) per stage

template <int TOK>
struct WgmmaTile {
  static_assert(TOK == 64 || TOK == 128 || TOK == 256, "wgmma N extent: 64, 128 or 256 tokens");
  // Stages in the ring and CTAs per SM (registers capped at 128 for 2): sized to fit the SM's 227 KB.
  static constexpr int kStages = TOK == 64 ? 6 : 5;
  static constexpr int kMinBlocks = TOK == 256 ? 1 : 2;
  static constexpr int kXBytes = TOK * kXRowBytes;
  static constexpr int kWBytes = kRows * kWRowBytes;
  static constexpr int kSBytes = kRows * kSRowBytes;
  // Every stage's x tile starts on a 1024-byte boundary (the swizzle atom).
  static constexpr int kStageBytes = (kXBytes + kWBytes + kSBytes + 1023) / 1024 * 1024;
  // + 1024: slack to align the ring, whatever the dynamic shared window's own alignment.
  static constexpr int kSmemBytes = kStages * kStageBytes + 1024;
};

// Byte offset of 16-byte chunk c (0..7) of token row r in an x stage: the 128-byte swizzle.
__host__ __device__ constexpr uint32_t x_offset(int r, int c) { return uint32_t(r * kXRowBytes + 16 * (c ^ (r & 7))); }

// prmt.b32 (selector nibbles 0-7 only): byte i of the result is byte sel[i] of the 8 bytes {hi, lo}. The host
// version lets a host program check the fragment mapping.
__host__ __device__ inline uint32_t perm(uint32_t lo, uint32_t hi, uint32_t sel) {
#ifdef __CUDA_ARCH__
  return __byte_perm(lo, hi, sel);
#else
  const uint64_t v = (uint64_t(hi) << 32) | lo;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= uint32_t((v >> (8 * ((sel >> (4 * i)) & 7))) & 0xffu) << (8 * i);
  return r;
#endif
}

// The D fragment's coordinates (wgmma.cuh): d[j] of lane (g, t) in warp `warp` (0-7 of the CTA) is tile row
// d_row(warp, g, j) and tile token d_token(t, j).
__host__ __device__ constexpr int d_row(int warp, int g, int j) { return 16 * warp + g + 8 * ((j >> 1) & 1); }
__host__ __device__ constexpr int d_token(int t, int j) { return 8 * (j >> 2) + 2 * t + (j & 1); }

// src_bytes = 0 writes 4 zero bytes without reading src.
__device__ __forceinline__ void cp_async4_zfill(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(src_bytes));
}

template <int TOK, typename T>
__global__ void __launch_bounds__(kThreads, WgmmaTile<TOK>::kMinBlocks)
    w4a16_wgmma_kernel(const Args<T> a, float* partials) {
  using Tile = WgmmaTile<TOK>;
  constexpr int kStages = Tile::kStages, kAhead = kStages - 2;
  static_assert(kAhead >= 1, "the ring needs a slot in flight besides the two being read");
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t raw = sm80::smem_addr(smem_raw);
  const uint32_t pad = ((raw + 1023u) & ~1023u) - raw;
  const uint8_t* const ring = smem_raw + pad;
  const uint32_t ring_addr = raw + pad;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int tok0 = blockIdx.x * TOK, row0 = blockIdx.y * kRows;
  // This split's stages (an empty split writes zero partials).
  const int stages_k = a.k / kStageK;
  const int per_split = (stages_k + int(gridDim.z) - 1) / int(gridDim.z);
  const int kt0 = min(stages_k, int(blockIdx.z) * per_split), kt1 = min(stages_k, kt0 + per_split);
  const int64_t row_bytes = a.k / 2, row_scales = a.k / kGroup;

  // Each thread's copies, fixed over K (element offsets into x, b, b_scale at k0 = 0): x rows xr + 32 it, chunk xc;
  // weight row wr, chunk wc; the scales of row tid (threads < 128). Rows past M or N are zero-filled, never read.
  const int xr = tid >> 3, xc = tid & 7, wr = tid >> 1, wc = tid & 1;
  const int64_t x_off = int64_t(tok0 + xr) * a.x_stride + 8 * xc, x_step = 32 * a.x_stride;
  const bool w_in = row0 + wr < a.n, s_in = tid < kRows && row0 + tid < a.n;
  const int64_t w_off = w_in ? (row0 + wr) * row_bytes + 16 * wc : 0;
  const int64_t s_off = s_in ? (row0 + tid) * row_scales : 0;

  auto load_stage = [&](int slot, int kt) {
    if (kt < kt1) {
      const int k0 = kt * kStageK;
      const uint32_t xs = ring_addr + slot * Tile::kStageBytes, ws = xs + Tile::kXBytes, ss = ws + Tile::kWBytes;
#pragma unroll
      for (int it = 0; it < TOK * 8 / kThreads; ++it) {  // TOK rows x 8 chunks
        const bool in = tok0 + xr + 32 * it < a.m;
        sm80::cp_async16_zfill(xs + x_offset(xr + 32 * it, xc), a.x + (in ? x_off + it * x_step + k0 : 0),
                               in ? 16 : 0);
      }
      // 128 rows x 2 chunks: one per thread.
      sm80::cp_async16_zfill(ws + wr * kWRowBytes + 16 * wc, a.b + (w_in ? w_off + k0 / 2 : 0), w_in ? 16 : 0);
      if (tid < kRows)
        cp_async4_zfill(ss + tid * kSRowBytes, a.b_scale + (s_in ? s_off + k0 / kGroup : 0), s_in ? 4 : 0);
    }
    sm80::cp_async_commit();  // an empty group past the end keeps the wait counts uniform
  };

  float acc[TOK / 2];
#pragma unroll
  for (int j = 0; j < TOK / 2; ++j) acc[j] = 0.f;

#pragma unroll
  for (int s = 0; s < kAhead; ++s) load_stage(s, kt0 + s);

  const int r0 = 16 * warp + g;  // this lane's fragment rows r0 and r0 + 8 of the tile (warpgroup warp / 4)
  const PairPicker pick(t);      // elements 2t, 2t + 1 of each paired word
  for (int kt = kt0; kt < kt1; ++kt) {
    const int i = kt - kt0, slot = i % kStages;
    sm80::cp_async_wait<kAhead - 1>();  // this thread's copies of stage i landed
    fence_proxy_async_shared();         // ... and are ordered before the async proxy's (wgmma's) reads
    __syncthreads();                    // everyone's copies; every warpgroup retired its wgmma of stage i - 2
    load_stage((i + kAhead) % kStages, kt + kAhead);

    const uint8_t* const st = ring + slot * Tile::kStageBytes;
    const uint8_t* const w0 = st + Tile::kXBytes + r0 * kWRowBytes;
    const uint8_t* const w1 = w0 + 8 * kWRowBytes;
    const uint32_t sc0 = *reinterpret_cast<const uint32_t*>(st + Tile::kXBytes + Tile::kWBytes + r0 * kSRowBytes);
    const uint32_t sc1 = *reinterpret_cast<const uint32_t*>(st + Tile::kXBytes + Tile::kWBytes + (r0 + 8) * kSRowBytes);
    const uint32_t xs = ring_addr + slot * Tile::kStageBytes;
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
      const uint2 q0 = *reinterpret_cast<const uint2*>(w0 + 8 * kk);
      const uint2 q1 = *reinterpret_cast<const uint2*>(w1 + 8 * kk);
      uint32_t s0, s1;  // step kk's scales of rows r0 and r0 + 8, as pairs
      scale_pairs<T>(perm(sc0, sc1, uint32_t(kk) | (uint32_t(kk + 4) << 4)), s0, s1);
      // The A fragment: (row r0, k 2t..2t+1), (r0 + 8, 2t..), (r0, 2t+8..), (r0 + 8, 2t+8..) (wgmma.cuh).
      uint32_t f[4];
      f[0] = mul2<T>(paired_pair<T>(q0.x, pick), s0);
      f[1] = mul2<T>(paired_pair<T>(q1.x, pick), s1);
      f[2] = mul2<T>(paired_pair<T>(q0.y, pick), s0);
      f[3] = mul2<T>(paired_pair<T>(q1.y, pick), s1);
      wgmma_fence();  // f was written by this thread
      Wgmma<TOK, T>::mma(acc, f, sw128_kmajor_desc(xs + 32 * kk));
      wgmma_commit();
      wgmma_wait<1>();  // the previous step's wgmma (and its registers) retired; this one runs under the next decode
    }
  }
  wgmma_wait<0>();
#pragma unroll
  for (int j = 0; j < TOK / 2; ++j) fence_operand(acc[j]);
  sm80::cp_async_wait<0>();  // only empty groups remain; none may be pending at exit

  int col[2];
  float scale[2] = {0.f, 0.f}, bias[2] = {0.f, 0.f};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    col[h] = row0 + d_row(warp, g, 2 * h);  // d[j]'s row for (j / 2) % 2 == h
    if (gridDim.z == 1 && col[h] < a.n) {
      scale[h] = a.global_scale[col[h] * a.global_scale_stride] * kUnbias;
      if (a.bias != nullptr) bias[h] = to_float(a.bias[col[h]]);
    }
  }
#pragma unroll
  for (int j = 0; j < TOK / 2; ++j) {
    const int h = (j >> 1) & 1, tok = tok0 + d_token(t, j);
    if (tok >= a.m || col[h] >= a.n) continue;
    if (gridDim.z == 1) {
      float v = acc[j] * scale[h];  // store_out's arithmetic (gemv.cuh)
      if (a.bias != nullptr) v += bias[h];
      a.out[int64_t(tok) * a.out_stride + col[h]] = from_float<T>(v);
    } else {
      partials[(int64_t(blockIdx.z) * a.m + tok) * a.n + col[h]] = acc[j];
    }
  }
}

}  // namespace blockfp8::fp4::sm90
