// The fragment packing of an NVFP4 weight (what the SM90 layer stores): its per-lane decode and the two weight-only
// kernels that read it besides the SM90 wgmma GEMM (sm90/w4a16_wgmma.cuh): the decode GEMV and the FMA fallback.
//
//   out[m, n] = global_scale[n] * sum_k x[m, k] * e2m1(code[n, k]) * scale[n, k / 16] (+ bias[n])
//
// Layout (reference.fragment_nvfp4_weight, made once at load; N % 16 == 0, K % 64 == 0). For each 16-row tile T and
// 64-deep K stage S one 512-byte block of codes at (T * K / 64 + S) * 512: lane l = 4 g + t's 16 bytes at 16 l are
// four paired words (decode.cuh), word kk holding the codes of its mma A fragment for k16 step kk: elements (row g,
// k 2t, 2t + 1), (g + 8, same k), (g, 2t + 8, 2t + 9), (g + 8, same k), k relative to 64 S + 16 kk. So
// decode_paired's 4 pairs ARE the fragment registers a[0..3] of mma.sync m16n8k16 and of one warp's share of wgmma
// m64nNk16 (sm90/wgmma.cuh): one 16-byte load per lane per stage, every word decoded whole (9 instructions for 8
// codes), no lane discarding another's bits. The scales, one exp8 byte each, in 64-byte blocks at (T * K / 64 + S)
// * 64: lane group g's 8 bytes at 8 g, row g's steps 0-3, then row g + 8's.
// exp8: (bf16 exponent field of scale * 2^119 - 237) << 3 | its 3 mantissa bits. Every positive e4m3 value is exact
// in it, and the 16-bit operand bits of scale * 2^c (decode.cuh: c = 119 for bf16, 7 for f16) are a shift, a mask
// and an add away, two scales per instruction: bf16 (byte << 4) + 0x7680, f16 (byte << 7) + 0x3400 (f16 exponent
// fields 13-30: normal). A zero scale has no byte: the packing zeroes the group's codes (the products are zero
// either way). Numerics as decode.cuh: every operand e2m1 * scale * 2^-7 exact, fp32 accumulation, global scale *
// 2^7 and the bias once per output in fp32.
// Arch: SM80+ instructions (mma.sync, ld.global.nc). Unsupported: N % 16 != 0 or K % 64 != 0 (the layer keeps the
// paired packing there); the GEMV also needs M <= 8 MT and 4-byte aligned x rows (the FMA kernel takes any).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "../common/convert.cuh"
#include "../common/sm80.cuh"
#include "decode.cuh"
#include "gemv.cuh"

namespace blockfp8::fp4 {

constexpr int kFragRows = 16;        // rows per fragment tile (the mma M extent)
constexpr int kFragK = 64;           // K per fragment stage: 4 k16 steps
constexpr int kFragBlockWords = 32;  // uint4 per (tile, stage) block of codes: one per lane
constexpr int kFragScaleWords = 8;   // uint2 per (tile, stage) block of scales: one per lane group

// Bytes 0 and 2 (even) or 1 and 3 of an exp8 word -> the T pair of their scales * 2^c (decode.cuh).
template <typename T>
__device__ __forceinline__ uint32_t exp8_pair(uint32_t w, bool even);
template <>
__device__ __forceinline__ uint32_t exp8_pair<__nv_bfloat16>(uint32_t w, bool even) {
  return ((even ? w << 4 : w >> 4) & 0x0ff00ff0u) + 0x76807680u;
}
template <>
__device__ __forceinline__ uint32_t exp8_pair<__half>(uint32_t w, bool even) {
  return ((even ? w << 7 : w >> 1) & 0x7f807f80u) + 0x34003400u;
}

// Half h (0 low, 1 high) of a T pair in both halves: the multiply that takes it reads it through its operand
// selector (no duplicating instruction).
template <typename T>
__device__ __forceinline__ uint32_t dup_half(uint32_t v, int h);
template <>
__device__ __forceinline__ uint32_t dup_half<__nv_bfloat16>(uint32_t v, int h) {
  const __nv_bfloat162 p = sm80::bit_cast<__nv_bfloat162>(v);
  return sm80::bit_cast<uint32_t>(h ? __high2bfloat162(p) : __low2bfloat162(p));
}
template <>
__device__ __forceinline__ uint32_t dup_half<__half>(uint32_t v, int h) {
  const __half2 p = sm80::bit_cast<__half2>(v);
  return sm80::bit_cast<uint32_t>(h ? __high2half2(p) : __low2half2(p));
}

// Step kk's A fragment: word kk of the lane's 16 bytes decoded, f[0], f[2] (row g) times row g's step-kk scale and
// f[1], f[3] (row g + 8) times row g + 8's. s: the lane group's 8 exp8 bytes.
template <typename T>
__device__ __forceinline__ void fragment_step(const uint4& w, const uint2& s, int kk, uint32_t (&f)[4]) {
  decode_paired<T>(sm80::word(w, kk), f);
  // {step 0, step 2} or {step 1, step 3} of each row as a T pair; the step's half of it.
  const uint32_t s0 = dup_half<T>(exp8_pair<T>(s.x, (kk & 1) == 0), kk >> 1);
  const uint32_t s1 = dup_half<T>(exp8_pair<T>(s.y, (kk & 1) == 0), kk >> 1);
  f[0] = mul2<T>(f[0], s0);
  f[1] = mul2<T>(f[1], s1);
  f[2] = mul2<T>(f[2], s0);
  f[3] = mul2<T>(f[3], s1);
}

// ------------------------------------------------------------------------------------------
// Decode GEMV: a block of KS warps owns one 16-row tile; warp w takes stages w, w + KS, ... (one 16-byte load per
// lane per stage), MT 8-token tiles (M <= 8 MT). The B fragment of step kk is x[token g] at k 2t, 2t + 1 and
// 2t + 8, 2t + 9 (pairs t, t + 4, ..., t + 28 of the stage: b[q] is pair t + 4 q), three ways (XPath):
//   kDirect: 8 4-byte loads per lane per stage, from L1. Cheapest while the lane groups share few token rows
//     (the product: M <= 3; tokens past M re-read the last); at M = 8 each load touches 8 rows (1.06-1.31x the
//     row-contiguous GEMV's time, 1.15-1.55x at M = 16: fp4/NOTES.md).
//   kBlockStaged (M = 1): the block copies x into shared memory once, before its first stage (the first weight
//     loads already in flight), permuted so that a lane's 8 pairs of a stage are contiguous: pair p of stage s at word
//     32 s + 8 (p % 4) + p / 4. A stage's x is then 2 16-byte shared loads per lane (the 4 t slots: 4 distinct 16-byte
//     pieces, conflict-free) in place of 8 4-byte L1 loads and their addresses: 7-8% fewer instructions per stage.
//     At M = 3 (three rows to copy before the first stage, lane groups on different rows) it was slower than direct
//     loads (fp4/NOTES.md). Needs 16-byte aligned x and block_x_bytes(K) of dynamic shared memory.
//   kWarpStaged: the warp copies its stage's x rows ([8 MT tokens][64], 128-byte rows, 16-byte chunk c of row r at
//     chunk c ^ (r % 8): no bank conflicts) into its own shared buffer with 16-byte cp.async (2 MT per lane), and two
//     ldmatrix.x4 per token tile give the 8 B registers (matrix (step kk, half h) = x[tokens][16 kk + 8 h, + 8): lane
//     (g, t) receives row g, elements 2t, 2t + 1 of each). One buffer, software-pipelined: the next stage's copies
//     are issued as soon as this stage's ldmatrix has read it, so they fly under this stage's decode and mma and the
//     next weight load. The buffer is reused for the partial sums at the end. X_VIA_L1: the copies keep x in L1
//     (cp.async.ca), so the blocks on an SM, which walk the same K stages at about the same time, fetch each x stage
//     from L2 once; .cg (false) bypasses L1, and at M = 16 x is 4x a stage's weight bytes (the probe times both).
// U: stages whose weight and scale loads a lane issues together before decoding the first (more bytes in flight per
//   SM; x keeps its one-stage pipeline). PREFETCH: the next group's loads are issued before this group decodes (two
//   register buffers of U stages). On the H200 probe U = 2 took 0.91-0.93x U = 1's time and U = 4 gained nothing
//   more; prefetch 0.95-0.97x on top where the table uses it (fp4/NOTES.md).
// Partial tiles are summed through shared memory in a fixed order (deterministic). Tokens past M: the direct loads
// re-read token M - 1 (in bounds, never stored); the staged copies skip them and their buffer rows are zeroed once
// (cp.async with many lanes on one address ran at 1.7-3.5x the time of distinct rows: fp4/NOTES.md).
// ------------------------------------------------------------------------------------------
enum class XPath { kDirect, kBlockStaged, kWarpStaged };

// kBlockStaged: the dynamic shared memory it takes (x's one row).
__host__ __device__ constexpr int64_t block_x_bytes(int64_t k) { return 2 * k; }

template <int KS, int MT, XPath XP>
struct FragmentGemvSmem {
  static constexpr int kPartialBytes = KS * MT * 4 * 32 * 4;  // [KS][MT * 4][32] fp32
  static constexpr int kXBytes =
      XP == XPath::kWarpStaged ? KS * MT * kMmaTokens * kFragK * 2 : 0;  // [KS][8 MT][64] 16-bit
  static constexpr int kBytes = kXBytes > kPartialBytes ? kXBytes : kPartialBytes;
};

template <int KS, int MT, int MIN_BLOCKS, XPath XP, typename T, bool X_VIA_L1 = true, int U = 1,
          bool PREFETCH = false>
__global__ void __launch_bounds__(32 * KS, MIN_BLOCKS) gemv_fragment_kernel(const Args<T> a) {
  static_assert(XP != XPath::kBlockStaged || MT == 1, "block-staged x is the M = 1 path");
  constexpr bool STAGE_X = XP == XPath::kWarpStaged;
  using Smem = FragmentGemvSmem<KS, MT, XP>;
  __shared__ __align__(128) uint8_t smem[Smem::kBytes];
  extern __shared__ __align__(16) uint32_t block_x[];  // kBlockStaged: [K / 2] words, permuted (above)
  float(*partial)[MT * 4][32] = reinterpret_cast<float(*)[MT * 4][32]>(smem);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2;
  const int tile = blockIdx.x, stages = a.k / kFragK;
  const uint4* wp = reinterpret_cast<const uint4*>(a.b) + (int64_t(tile) * stages + warp) * kFragBlockWords + lane;
  const uint2* sp = reinterpret_cast<const uint2*>(a.b_scale) + (int64_t(tile) * stages + warp) * kFragScaleWords + g;
  // kDirect: x of token mt * 8 + g as 4-byte pairs, at pair t of the warp's first stage.
  // kWarpStaged: this lane's 2 MT copies (token row xr = (lane + 32 i) / 8, chunk xc = lane % 8), and its
  // ldmatrix row address (matrix j = lane / 8: step 2 q + j / 2, half j % 2; row lane % 8).
  const uint32_t* xp[MT];
  constexpr int kCopies = STAGE_X ? 2 * MT : 1;
  const T* x_src[kCopies];
  uint32_t x_dst[kCopies];
  uint32_t x_base = 0, ld_row = 0;
  int live_copies = 0;  // kWarpStaged: copy i of this lane holds token row (lane >> 3) + 4 i, a row < M if i < this
  if constexpr (STAGE_X) {
    live_copies = (a.m - (lane >> 3) + 3) >> 2;
    x_base = sm80::smem_addr(smem) + uint32_t(warp) * (MT * kMmaTokens * kFragK * 2);
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const int xr = (lane + 32 * i) >> 3, xc = lane & 7;
      x_src[i] = a.x + int64_t(min(xr, a.m - 1)) * a.x_stride + warp * kFragK + 8 * xc;
      x_dst[i] = x_base + uint32_t(xr * 128 + 16 * (xc ^ (xr & 7)));
      if (i >= live_copies) sm80::st_shared_zero16(x_dst[i]);  // never copied: zeroed once (columns never stored)
    }
    ld_row = uint32_t(lane & 7);
  } else if constexpr (XP == XPath::kDirect) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      xp[mt] = reinterpret_cast<const uint32_t*>(a.x + int64_t(min(mt * kMmaTokens + g, a.m - 1)) * a.x_stride +
                                                 warp * kFragK) + (lane & 3);
  }
  // kBlockStaged: this lane's 8 words of its warp's first stage (slot t).
  const uint4* xs = reinterpret_cast<const uint4*>(block_x + 32 * warp + 8 * (lane & 3));
  // kBlockStaged: the copy of x into block_x (16-byte loads, each scattered to 4 words), before the first stage.
  auto stage_block_x = [&]() {
    if constexpr (XP == XPath::kBlockStaged) {
      const uint4* src = reinterpret_cast<const uint4*>(a.x);
      for (int c = threadIdx.x; c < a.k / 8; c += 32 * KS) {  // chunk c: pairs 4 c .. 4 c + 3
        const uint4 v = __ldg(src + c);
        uint32_t* d = block_x + 32 * (c >> 3) + (c & 7);  // pair 4 c + j: stage c / 8, slot j, word c % 8
        d[0] = v.x, d[8] = v.y, d[16] = v.z, d[24] = v.w;
      }
      __syncthreads();
    }
  };

  // kWarpStaged: the copies of the warp's next stage into its buffer (none past its last stage).
  auto copy_x = [&](bool more) {
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      if (more && i < live_copies) {
        if constexpr (X_VIA_L1)
          sm80::cp_async16_l1(x_dst[i], x_src[i]);
        else
          sm80::cp_async16_zfill(x_dst[i], x_src[i], 16);
      }
      x_src[i] += KS * kFragK;
    }
    sm80::cp_async_commit();
  };
  const int my_stages = (stages - warp + KS - 1) / KS;
  if constexpr (STAGE_X) copy_x(my_stages > 0);

  float acc[MT][2][4] = {};  // two accumulators per token tile: consecutive steps do not wait on each other
  // The weight and scale loads of a group of U stages (those of the `left` still to run), issued together.
  auto load_group = [&](uint4(&w)[U], uint2(&s)[U], int left) {
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (u < left) {
        w[u] = sm80::load_weight(wp + u * KS * kFragBlockWords);
        s[u] = __ldg(sp + u * KS * kFragScaleWords);
      }
    wp += U * KS * kFragBlockWords;
    sp += U * KS * kFragScaleWords;
  };
  // The group's stages in order: each stage's x (direct loads, or the staged buffer and the next stage's copies), the
  // decode and the mma.
  auto run_group = [&](const uint4(&w)[U], const uint2(&s)[U], int left) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (u >= left) break;
      uint32_t b[MT][8];
      if constexpr (STAGE_X) {
        sm80::cp_async_wait<0>();
        __syncwarp();
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int q = 0; q < 2; ++q) {  // steps 2q, 2q + 1: chunks 4q + j of the token row
            const int j = lane >> 3, chunk = 4 * q + j;
            const uint32_t row = uint32_t(mt * kMmaTokens) + ld_row;
            uint32_t r[4];
            sm80::ldmatrix_x4(r, x_base + row * 128 + 16 * (uint32_t(chunk) ^ ld_row));
            b[mt][4 * q] = r[0], b[mt][4 * q + 1] = r[1], b[mt][4 * q + 2] = r[2], b[mt][4 * q + 3] = r[3];
          }
        __syncwarp();  // every lane's ldmatrix read the buffer before the next stage's copies overwrite it
        copy_x(left - u > 1);
      } else if constexpr (XP == XPath::kBlockStaged) {
        const uint4 lo = xs[0], hi = xs[1];
        b[0][0] = lo.x, b[0][1] = lo.y, b[0][2] = lo.z, b[0][3] = lo.w;
        b[0][4] = hi.x, b[0][5] = hi.y, b[0][6] = hi.z, b[0][7] = hi.w;
        xs += KS * 8;  // KS stages of 32 words
      } else {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int q = 0; q < 8; ++q) b[mt][q] = __ldg(xp[mt] + 4 * q);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) xp[mt] += KS * kFragK / 2;
      }
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        uint32_t f[4];
        fragment_step<T>(w[u], s[u], kk, f);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          float* d = acc[mt][kk & 1];
          sm80::mma16816<T>(d[0], d[1], d[2], d[3], f[0], f[1], f[2], f[3], b[mt][2 * kk], b[mt][2 * kk + 1]);
        }
      }
    }
  };
  uint4 wa[U], wb[U];
  uint2 sa[U], sb[U];
  if constexpr (PREFETCH) {
    // Two register buffers: the next group's loads are in flight while this group decodes, so a warp always has U
    // stages' loads outstanding (without it: U at the group's start, none while its last stage decodes).
    int left = my_stages;
    load_group(wa, sa, left);
    stage_block_x();
    while (left > 0) {
      load_group(wb, sb, left - U);
      run_group(wa, sa, left);
      if ((left -= U) <= 0) break;
      load_group(wa, sa, left - U);
      run_group(wb, sb, left);
      left -= U;
    }
  } else {
    int left = my_stages;
    load_group(wa, sa, left);
    stage_block_x();  // every thread, before any warp leaves for its stages (a warp may have none)
    while (left > 0) {
      run_group(wa, sa, left);
      if ((left -= U) > 0) load_group(wa, sa, left);
    }
  }

  if constexpr (STAGE_X) __syncthreads();  // the x buffers become the partial sums
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < 4; ++i) partial[warp][mt * 4 + i][lane] = acc[mt][0][i] + acc[mt][1][i];
  __syncthreads();
  for (int e = threadIdx.x; e < MT * 4 * 32; e += 32 * KS) {
    const int slot = e >> 5, ln = e & 31;
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < KS; ++w) sum += partial[w][slot][ln];
    // Accumulator element i of lane ln: row g (+8 for i >= 2), token 2t + (i & 1).
    const int mt = slot / 4, i = slot & 3;
    const int col = tile * kFragRows + (ln >> 2) + (i >= 2 ? 8 : 0);
    const int tok = mt * kMmaTokens + 2 * (ln & 3) + (i & 1);
    if (tok < a.m) store_out(a, tok, col, sum);
  }
}

// ------------------------------------------------------------------------------------------
// FMA fallback on the fragment packing: any M (R tokens per pass, grid.y strides over M), x rows only 2-byte
// aligned. One warp per 16-row tile; lane (g, t) decodes its fragment words as the tensor-core kernels do and
// multiplies each pair by x's two elements at the same K in fp32; the 4 lanes of a group (t) are summed by
// shuffles, then lane t = 0 stores rows g and g + 8.
// ------------------------------------------------------------------------------------------
template <int R, typename T>
__global__ void gemv_fma_fragment_kernel(const Args<T> a) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int tile = blockIdx.x * kFmaWarps + (threadIdx.x >> 5);
  if (tile >= a.n / kFragRows) return;  // warp-uniform, and the kernel has no block-level barrier
  const int stages = a.k / kFragK;
  const uint4* wtile = reinterpret_cast<const uint4*>(a.b) + int64_t(tile) * stages * kFragBlockWords + lane;
  const uint2* stile = reinterpret_cast<const uint2*>(a.b_scale) + int64_t(tile) * stages * kFragScaleWords + g;
  for (int m0 = blockIdx.y * R; m0 < a.m; m0 += gridDim.y * R) {
    const int rows = min(R, a.m - m0);
    float acc[R][2] = {};  // [token][row g / g + 8]
    for (int s = 0; s < stages; ++s) {
      const uint4 w = sm80::load_weight(wtile + int64_t(s) * kFragBlockWords);
      const uint2 sc = __ldg(stile + int64_t(s) * kFragScaleWords);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        uint32_t f[4];
        fragment_step<T>(w, sc, kk, f);
        const float2 r0 = sm80::x2_to_float2<T>(f[0]), r1 = sm80::x2_to_float2<T>(f[1]);
        const float2 r0h = sm80::x2_to_float2<T>(f[2]), r1h = sm80::x2_to_float2<T>(f[3]);
        const int k0 = s * kFragK + 16 * kk + 2 * t;
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if (r >= rows) break;
          const T* xr = a.x + int64_t(m0 + r) * a.x_stride + k0;
          const float x0 = to_float(xr[0]), x1 = to_float(xr[1]), x8 = to_float(xr[8]), x9 = to_float(xr[9]);
          acc[r][0] = fmaf(r0.x, x0, fmaf(r0.y, x1, fmaf(r0h.x, x8, fmaf(r0h.y, x9, acc[r][0]))));
          acc[r][1] = fmaf(r1.x, x0, fmaf(r1.y, x1, fmaf(r1h.x, x8, fmaf(r1h.y, x9, acc[r][1]))));
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float v = acc[r][h];
        v += __shfl_xor_sync(0xffffffffu, v, 1);
        v += __shfl_xor_sync(0xffffffffu, v, 2);
        if (t == 0 && r < rows) store_out(a, m0 + r, tile * kFragRows + g + 8 * h, v);
      }
    }
  }
}

}  // namespace blockfp8::fp4
