// Weight-only NVFP4 decode GEMV kernels (bodies; the table and launchers are in sm80.cu).
//
//   out[m, n] = global_scale[n] * sum_k x[m, k] * e2m1(b[n, k]) * b_scale[n, k / 16]
//
// Layouts (fp4.h): x 16-bit [m, k] (row stride x_stride), b packed e2m1 [n, k / 2] in ModelOpt's packing or
// the paired one (PAIRED, decode.cuh), b_scale e4m3 [n, k / 16], global_scale fp32 [n], out x's dtype [m, n]
// (row stride out_stride).
// Arch: SM80+ instructions only (mma.sync m16n8k16, ld.global.nc); cvt.rn.f16x2.e4m3x2 is native
// from SM89. Numerics: decode.cuh (every operand exact, fp32 accumulation, the global scale and
// the bias applied once per output in fp32). Unsupported: k % 32 != 0; the tensor-core kernel
// also needs k % 128 == 0, m <= 8 * MT and 16-byte aligned x rows.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "../common/convert.cuh"
#include "../common/sm80.cuh"
#include "decode.cuh"

namespace blockfp8::fp4 {

constexpr int kGroup = 16;      // values per e4m3 scale
constexpr int kMmaRows = 16;    // weight rows per mma tile (the mma M extent)
constexpr int kMmaTokens = 8;   // tokens per mma n-tile (the mma N extent)
constexpr int kWindow = 128;    // K per lane-quad window: 16 bytes of each row per lane
constexpr int kFmaWarps = 4;    // warps per FMA block

template <typename T>
struct Args {
  const T* x;
  const uint8_t* b;
  const uint8_t* b_scale;
  const float* global_scale;
  int64_t global_scale_stride;  // 0: one value for every row
  const T* bias;
  T* out;
  int m, n, k;
  int64_t x_stride, out_stride;
};

// The one epilogue arithmetic of every FP4 kernel (these GEMVs, the SM90 wgmma GEMM's three stores): fp32 sum x
// (global scale x kUnbias), then + bias. The multiply and the add are rounded separately (__fmul_rn / __fadd_rn: never
// contracted into an FMA), so every kernel that reaches the same sum stores the same bits: left to the compiler, one
// inlined copy fused 3 of 4 multiply-adds and not the 4th. No bias adds nothing (not + 0, which would turn -0 into +0).
__device__ __forceinline__ float scale_and_bias(float sum, float unbiased_scale, float bias, bool has_bias) {
  const float v = __fmul_rn(sum, unbiased_scale);
  return has_bias ? __fadd_rn(v, bias) : v;
}

template <typename T>
__device__ __forceinline__ void store_out(const Args<T>& a, int tok, int col, float sum) {
  const bool has_bias = a.bias != nullptr;
  const float v = scale_and_bias(sum, a.global_scale[col * a.global_scale_stride] * kUnbias,
                                 has_bias ? to_float(a.bias[col]) : 0.f, has_bias);
  a.out[int64_t(tok) * a.out_stride + col] = from_float<T>(v);
}

// ------------------------------------------------------------------------------------------
// Tensor-core kernel: a block of KS warps computes CT tiles of 16 output columns x 8 * MT tokens.
// The weight is the mma A operand (rows on the mma M extent), x the B operand (tokens on N).
// Lane (g = lane / 4, t = lane % 4) of a window (128 K) reads bytes [16t, 16t + 16) of the window
// in rows g and g + 8 of each column tile: elements 32t .. 32t + 31, i.e. scale groups 2t and
// 2t + 1, and the 32 x elements of token g at the same K (four 16-byte loads). Word i of the
// weight chunk feeds two mma k-steps: ModelOpt's packing decodes to pairs (j, j + 4) and x_pairs()
// regroups x to match; the paired packing decodes to (2j, 2j + 1), x's order as loaded. Either way the
// K axis is permuted identically in both operands (a reduction axis: the sum is unchanged). Each lane
// scales its own decoded pairs, so no scale crosses lanes inside an mma.
// Warp w takes windows w, w + KS, ...; the KS partial tiles are summed through shared memory in a
// fixed order (deterministic). Columns past N re-read row N - 1 and tokens past M re-read token
// M - 1 (in bounds, never stored).
// ------------------------------------------------------------------------------------------
template <int KS, int MT, int CT, int U, int MIN_BLOCKS, int ACCS, bool PAIRED, typename T>
__global__ void __launch_bounds__(32 * KS, MIN_BLOCKS) gemv_mma_kernel(const Args<T> a) {
  __shared__ float partial[KS][CT * MT * 4][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * (CT * kMmaRows);
  const int64_t row_bytes = a.k / 2, row_scales = a.k / kGroup;
  const uint8_t* wp[CT][2];
  const uint8_t* sp[CT][2];
#pragma unroll
  for (int c = 0; c < CT; ++c)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = min(n0 + c * kMmaRows + g + 8 * h, a.n - 1);
      wp[c][h] = a.b + row * row_bytes + warp * (kWindow / 2) + 16 * t;
      sp[c][h] = a.b_scale + row * row_scales + warp * (kWindow / kGroup) + 2 * t;
    }
  const T* xp[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
    xp[mt] = a.x + int64_t(min(mt * kMmaTokens + g, a.m - 1)) * a.x_stride + warp * kWindow + 32 * t;
  constexpr int kStep = KS * kWindow;  // K between a warp's windows

  // ACCS == 2: two accumulators per tile, so the two mma of a word do not wait on each other.
  float acc[CT][MT][ACCS][4] = {};
  for (int left = (a.k / kWindow - warp + KS - 1) / KS; left > 0; left -= U) {
    uint4 w[U][CT][2], xv[U][MT][4];
    uint32_t s[U][CT][2];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (u < left) {
#pragma unroll
        for (int c = 0; c < CT; ++c)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            w[u][c][h] = sm80::load_weight(wp[c][h] + u * (kStep / 2));
            s[u][c][h] = __ldg(reinterpret_cast<const unsigned short*>(sp[c][h] + u * (kStep / kGroup)));
          }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int q = 0; q < 4; ++q) xv[u][mt][q] = sm80::load_x8(xp[mt] + u * kStep + 8 * q);
      }
    }
#pragma unroll
    for (int c = 0; c < CT; ++c)
#pragma unroll
      for (int h = 0; h < 2; ++h) wp[c][h] += U * (kStep / 2), sp[c][h] += U * (kStep / kGroup);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) xp[mt] += U * kStep;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (u >= left) break;
#pragma unroll
      for (int c = 0; c < CT; ++c) {
        uint32_t scale[2][2];  // [row g / g + 8][group 2t / 2t + 1]
        scale_pairs<T>(s[u][c][0], scale[0][0], scale[0][1]);
        scale_pairs<T>(s[u][c][1], scale[1][0], scale[1][1]);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          uint32_t lo[4], hi[4];
          decode_scaled_packed<PAIRED, T>(sm80::word(w[u][c][0], i), scale[0][i / 2], lo);
          decode_scaled_packed<PAIRED, T>(sm80::word(w[u][c][1], i), scale[1][i / 2], hi);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            uint32_t b[4];
            x_operand<PAIRED>(xv[u][mt][i], b);
            float* d = acc[c][mt][0];
            float* e = acc[c][mt][ACCS - 1];
            sm80::mma16816<T>(d[0], d[1], d[2], d[3], lo[0], hi[0], lo[1], hi[1], b[0], b[1]);
            sm80::mma16816<T>(e[0], e[1], e[2], e[3], lo[2], hi[2], lo[3], hi[3], b[2], b[3]);
          }
        }
      }
    }
  }

#pragma unroll
  for (int c = 0; c < CT; ++c)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int i = 0; i < 4; ++i) partial[warp][(c * MT + mt) * 4 + i][lane] = ACCS == 2 ? acc[c][mt][0][i] + acc[c][mt][ACCS - 1][i] : acc[c][mt][0][i];
  __syncthreads();
  for (int e = threadIdx.x; e < CT * MT * 4 * 32; e += 32 * KS) {
    const int slot = e >> 5, ln = e & 31;
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < KS; ++w) sum += partial[w][slot][ln];
    // Accumulator element i of lane ln: row g (+8 for i >= 2), token 2t + (i & 1).
    const int c = slot / (MT * 4), mt = (slot / 4) % MT, i = slot & 3;
    const int col = n0 + c * kMmaRows + (ln >> 2) + (i >= 2 ? 8 : 0);
    const int tok = mt * kMmaTokens + 2 * (ln & 3) + (i & 1);
    if (col < a.n && tok < a.m) store_out(a, tok, col, sum);
  }
}

// ------------------------------------------------------------------------------------------
// FMA kernel, the correctness fallback: any M (R tokens per pass, grid.y strides over M), any N,
// K % 32 == 0, x rows only 2-byte aligned. One warp per output column; lane l reads the 16-byte
// chunks k = 32 l + 1024 i (two whole scale groups each), decodes them with the tensor-core
// kernel's arithmetic and accumulates in fp32; a butterfly sums the warp.
// ------------------------------------------------------------------------------------------
template <int R, bool PAIRED, typename T>
__global__ void gemv_fma_kernel(const Args<T> a) {
  const int lane = threadIdx.x & 31;
  const int col = blockIdx.x * kFmaWarps + (threadIdx.x >> 5);
  if (col >= a.n) return;  // warp-uniform, and the kernel has no block-level barrier
  const uint8_t* wrow = a.b + int64_t(col) * (a.k / 2);
  const uint8_t* srow = a.b_scale + int64_t(col) * (a.k / kGroup);
  const bool x_vec = (reinterpret_cast<uintptr_t>(a.x) & 15) == 0 && (a.x_stride & 7) == 0;
  for (int m0 = blockIdx.y * R; m0 < a.m; m0 += gridDim.y * R) {
    const int rows = min(R, a.m - m0);
    float acc[R] = {};
    for (int kk = 32 * lane; kk < a.k; kk += 32 * 32) {
      const uint4 wv = sm80::load_weight(wrow + kk / 2);
      uint32_t scale[2];
      scale_pairs<T>(__ldg(reinterpret_cast<const unsigned short*>(srow + kk / kGroup)), scale[0], scale[1]);
      float wf[32];  // element order
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        uint32_t v[4];
        decode_scaled_in_order<PAIRED, T>(sm80::word(wv, i), scale[i / 2], v);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float2 f = sm80::x2_to_float2<T>(v[j]);
          wf[8 * i + 2 * j] = f.x, wf[8 * i + 2 * j + 1] = f.y;
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r >= rows) break;
        const T* xr = a.x + int64_t(m0 + r) * a.x_stride + kk;
        float sum = 0.f;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const uint4 xv = x_vec ? sm80::load_x8(xr + 8 * q) : sm80::load_x8_unaligned(xr + 8 * q);
#pragma unroll
          for (int h = 0; h < 4; ++h) {
            const float2 f = sm80::x2_to_float2<T>(sm80::word(xv, h));
            sum = fmaf(f.x, wf[8 * q + 2 * h], fmaf(f.y, wf[8 * q + 2 * h + 1], sum));
          }
        }
        acc[r] += sum;
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float v = acc[r];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (lane == r % 32 && r < rows) store_out(a, m0 + r, col, v);
    }
  }
}

}  // namespace blockfp8::fp4
