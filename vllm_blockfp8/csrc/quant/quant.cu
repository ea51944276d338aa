// Per-token-group FP8 activation quantizer and block-FP8 weight dequantizer.
//
// Quantizer math (bit-exact with reference.quantize_per_token_group): for each token row and
// each group of 128 K-values, scale = max(amax, 1e-10) / 448 (fp32), q = e4m3_satfinite_rn(x /
// scale) with IEEE fp32 division (this file must not be built with fast-math).
// Layouts: x [M, K] bf16/fp16 row-major (row stride x_stride); q fp8 [M, K] contiguous; scales
// M-major s[g * s_ld + m] (the layout the W8A8 GEMM's TMA reads; s_ld = round_up(M, 4)).
// Work split: 16 lanes own one (token, group) pair, 8 values (one 16-byte load) each; a 256-thread
// block covers 16 consecutive tokens of one group, so its 16 scale stores are one 64-byte run.
// Arch: any SM80+ (plain loads, cvt to e4m3 needs SM89 for the hardware path; the intrinsic
// falls back to software on older archs). Unsupported: K % 128 != 0 (the wrapper rejects it).
//
// Bias add: out += bias per column, for the linear paths that have no fused epilogue.
// Dequantizer: w[n, k] = e4m3(b[n, k]) * b_scale[n/128, k/128] in 16-bit, 16 values per thread;
// used by the fallback linear row (dequantize + cuBLAS) where no W8A8 kernel exists for the arch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "../common/convert.cuh"
#include "quant.h"

namespace blockfp8::quant {
namespace {

constexpr int kGroup = 128;
constexpr int kLanesPerGroup = 16;       // 16 lanes x 8 values = one group
constexpr int kTokensPerBlock = 16;      // 16 x 16 = 256 threads
constexpr float kFp8Max = 448.0f;
constexpr float kAmaxFloor = 1e-10f;

template <typename T>
__global__ void __launch_bounds__(kLanesPerGroup * kTokensPerBlock)
per_token_group_kernel(const T* __restrict__ x, uint8_t* __restrict__ q, float* __restrict__ s,
                       int64_t m, int64_t k, int64_t x_stride, int64_t s_ld) {
  const int lane = threadIdx.x % kLanesPerGroup;
  const int64_t row = int64_t(blockIdx.y) * kTokensPerBlock + threadIdx.x / kLanesPerGroup;
  const int64_t group = blockIdx.x;
  // Rows past M still take part in the shuffles (all 16 lanes of a row share the predicate).
  const bool active = row < m;

  float v[8];
  if (active) {
    const uint4 raw = *reinterpret_cast<const uint4*>(x + row * x_stride + group * kGroup + lane * 8);
    const T* h = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = to_float(h[i]);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = 0.0f;
  }
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
  for (int offset = kLanesPerGroup / 2; offset > 0; offset /= 2)
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset, kLanesPerGroup));
  if (!active) return;

  const float scale = fmaxf(amax, kAmaxFloor) / kFp8Max;
  uint2 packed;
  uint8_t* out = reinterpret_cast<uint8_t*>(&packed);
#pragma unroll
  for (int i = 0; i < 8; ++i)
    out[i] = __nv_cvt_float_to_fp8(v[i] / scale, __NV_SATFINITE, __NV_E4M3);
  *reinterpret_cast<uint2*>(q + row * k + group * kGroup + lane * 8) = packed;
  if (lane == 0) s[group * s_ld + row] = scale;
}

template <typename T>
__global__ void __launch_bounds__(256)
dequant_weight_kernel(const uint8_t* __restrict__ b, const float* __restrict__ b_scale, T* __restrict__ w,
                      int64_t n, int64_t k) {
  const int64_t chunks_per_row = k / 16;
  const int64_t scale_cols = (k + kGroup - 1) / kGroup;
  const int64_t total = n * chunks_per_row;
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < total;
       c += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = c / chunks_per_row;
    const int64_t col = (c - row * chunks_per_row) * 16;
    // 16 consecutive values never straddle a 128-wide block (col is a multiple of 16).
    const float scale = b_scale[(row / kGroup) * scale_cols + col / kGroup];
    const uint4 raw = *reinterpret_cast<const uint4*>(b + row * k + col);
    const __nv_fp8_storage_t* f8 = reinterpret_cast<const __nv_fp8_storage_t*>(&raw);
    alignas(16) T vals[16];
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
      const __half2_raw pair = __nv_cvt_fp8x2_to_halfraw2(
          static_cast<__nv_fp8x2_storage_t>(f8[i] | (uint16_t(f8[i + 1]) << 8)), __NV_E4M3);
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&pair));
      vals[i] = from_float<T>(f.x * scale);
      vals[i + 1] = from_float<T>(f.y * scale);
    }
    uint4* dst = reinterpret_cast<uint4*>(w + row * k + col);
    dst[0] = reinterpret_cast<const uint4*>(vals)[0];
    dst[1] = reinterpret_cast<const uint4*>(vals)[1];
  }
}

template <typename T>
__global__ void __launch_bounds__(256)
add_bias_kernel(T* __restrict__ out, const T* __restrict__ bias, int64_t m, int64_t n) {
  const int64_t total = m * n;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_float<T>(to_float(out[i]) + to_float(bias[i % n]));
}

}  // namespace

cudaError_t launch_add_bias(const BiasProblem& p, cudaStream_t stream) {
  const int64_t total = p.m * p.n;
  if (total == 0) return cudaSuccess;
  const int64_t blocks = (total + 255) / 256;
  const dim3 grid(static_cast<unsigned>(blocks < 65536 ? blocks : 65536));
  if (p.bf16) {
    add_bias_kernel<__nv_bfloat16><<<grid, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(p.out),
                                                             static_cast<const __nv_bfloat16*>(p.bias), p.m, p.n);
  } else {
    add_bias_kernel<__half><<<grid, 256, 0, stream>>>(static_cast<__half*>(p.out), static_cast<const __half*>(p.bias),
                                                      p.m, p.n);
  }
  return cudaGetLastError();
}

cudaError_t launch_per_token_group(const TokenGroupProblem& p, cudaStream_t stream) {
  if (p.m == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(p.k / kGroup),
                  static_cast<unsigned>((p.m + kTokensPerBlock - 1) / kTokensPerBlock));
  const dim3 block(kLanesPerGroup * kTokensPerBlock);
  if (p.bf16) {
    per_token_group_kernel<__nv_bfloat16><<<grid, block, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(p.x), p.q, p.s, p.m, p.k, p.x_stride, p.s_ld);
  } else {
    per_token_group_kernel<__half><<<grid, block, 0, stream>>>(
        static_cast<const __half*>(p.x), p.q, p.s, p.m, p.k, p.x_stride, p.s_ld);
  }
  return cudaGetLastError();
}

cudaError_t launch_dequant_weight(const DequantProblem& p, cudaStream_t stream) {
  const int64_t chunks = p.n * (p.k / 16);
  if (chunks == 0) return cudaSuccess;
  const int64_t blocks = (chunks + 255) / 256;
  const dim3 grid(static_cast<unsigned>(blocks < 65536 ? blocks : 65536));
  if (p.bf16) {
    dequant_weight_kernel<__nv_bfloat16><<<grid, 256, 0, stream>>>(
        p.b, p.b_scale, static_cast<__nv_bfloat16*>(p.w), p.n, p.k);
  } else {
    dequant_weight_kernel<__half><<<grid, 256, 0, stream>>>(p.b, p.b_scale, static_cast<__half*>(p.w),
                                                            p.n, p.k);
  }
  return cudaGetLastError();
}

}  // namespace blockfp8::quant
