// NVFP4 activation quantizer and scale-factor swizzle for the native W4A4 GEMM (rule and layout: native.h).
//
// Arch-neutral (compiled for every arch the extension builds): the E2M1 rounding is a compare chain, not SM100+'s
// cvt.e2m1x2, so the same bits come out everywhere and the H200 can test it. The E4M3 rounding is
// __nv_cvt_float_to_fp8 (round to nearest even, saturating; a hardware cvt on SM89+).
//
// One thread per (row, 16-value group) of the padded scale grid: it reads 32 bytes of x (two 16-byte loads),
// writes 8 bytes of codes and one scale byte. Padded rows and columns only write their scale byte (0).
// Unsupported: k % 32 != 0, x rows not 16-byte aligned (the op copies such x first).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "native.h"

namespace blockfp8::fp4::native {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535 * 8;  // grid-stride beyond this

// E2M1 code of v (already divided by its scale): the thresholds of reference._e2m1_codes. '>' at a midpoint
// whose upper neighbour has an odd mantissa and '>=' at an even one is round-half-to-even on the E2M1 grid.
__device__ __forceinline__ uint32_t e2m1_code(float v) {
  const float a = fabsf(v);
  uint32_t c = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
  return c | ((v < 0.f && c != 0) ? 8u : 0u);
}

__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

template <typename T>
__global__ void __launch_bounds__(kThreads) quantize_kernel(QuantProblem p) {
  const int64_t groups = p.k / kGroup, cols = sf_cols(p.k), total = sf_rows(p.m) * cols;
  const float input_scale = __ldg(p.input_scale);
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < total; i += int64_t(gridDim.x) * kThreads) {
    const int64_t r = i / cols, c = i % cols;
    uint8_t sf = 0;
    if (r < p.m && c < groups) {
      const T* src = static_cast<const T*>(p.x) + r * p.x_stride + c * kGroup;
      T v[kGroup];
      *reinterpret_cast<uint4*>(&v[0]) = __ldg(reinterpret_cast<const uint4*>(src));
      *reinterpret_cast<uint4*>(&v[8]) = __ldg(reinterpret_cast<const uint4*>(src) + 1);
      float f[kGroup], amax = 0.f;
#pragma unroll
      for (int j = 0; j < kGroup; ++j) {
        f[j] = to_float(v[j]);
        amax = fmaxf(amax, fabsf(f[j]));
      }
      const float want = fminf(__fdiv_rn(__fdiv_rn(amax, 6.f), input_scale), 448.f);
      const __nv_fp8_storage_t s8 = __nv_cvt_float_to_fp8(want, __NV_SATFINITE, __NV_E4M3);
      sf = s8;
      const float d = __half2float(__half(__nv_cvt_fp8_to_halfraw(s8, __NV_E4M3))) * input_scale;
      uint32_t lo = 0, hi = 0;
      if (d > 0.f) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          lo |= e2m1_code(__fdiv_rn(f[j], d)) << (4 * j);  // element 2i in the low nibble (ModelOpt packing)
          hi |= e2m1_code(__fdiv_rn(f[8 + j], d)) << (4 * j);
        }
      }
      *reinterpret_cast<uint2*>(p.q + r * (p.k / 2) + c * (kGroup / 2)) = make_uint2(lo, hi);
    }
    p.sf[sf_offset(r, c, cols)] = sf;
  }
}

__global__ void __launch_bounds__(kThreads) swizzle_kernel(SwizzleProblem p) {
  const int64_t groups = p.k / kGroup, cols = sf_cols(p.k), total = sf_rows(p.rows) * cols;
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < total; i += int64_t(gridDim.x) * kThreads) {
    const int64_t r = i / cols, c = i % cols;
    p.out[sf_offset(r, c, cols)] = (r < p.rows && c < groups) ? p.scale[r * groups + c] : uint8_t(0);
  }
}

unsigned blocks_for(int64_t total) {
  return unsigned(std::max<int64_t>(1, std::min<int64_t>((total + kThreads - 1) / kThreads, kMaxBlocks)));
}

}  // namespace

cudaError_t launch_quantize(const QuantProblem& p, cudaStream_t s) {
  if (p.k % 32 != 0 || p.m < 0 || (p.m > 1 && p.x_stride < p.k) || p.x_stride % 8 != 0 ||
      reinterpret_cast<uintptr_t>(p.x) % 16 != 0)
    return cudaErrorInvalidValue;
  if (p.k == 0) return cudaSuccess;
  const unsigned blocks = blocks_for(sf_rows(p.m) * sf_cols(p.k));
  if (p.bf16)
    quantize_kernel<__nv_bfloat16><<<blocks, kThreads, 0, s>>>(p);
  else
    quantize_kernel<__half><<<blocks, kThreads, 0, s>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_swizzle(const SwizzleProblem& p, cudaStream_t s) {
  if (p.k % kGroup != 0 || p.rows < 0) return cudaErrorInvalidValue;
  if (p.k == 0) return cudaSuccess;
  swizzle_kernel<<<blocks_for(sf_rows(p.rows) * sf_cols(p.k)), kThreads, 0, s>>>(p);
  return cudaGetLastError();
}

}  // namespace blockfp8::fp4::native
