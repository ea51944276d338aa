// The arch-neutral reference native NVFP4 x NVFP4 GEMM and the native rows' self-check device helpers
// (native_reference.h). Plain CUDA with software E2M1 decode, compiled for every arch the build targets.
//
// The comparison's bound, |D - ref| <= 2^-7 |ref| + 2^-9 mag (mag = |alpha| sum_k |a| |b| sa sb):
//  - every product e2m1 * e2m1 * e4m3 * e4m3 has at most 2 + 2 + 4 + 4 significant bits and lies inside fp32's
//    normal range (>= 2^-20 even with e4m3 subnormal scales), so the native GEMM's products are exact in any order;
//  - so D differs from the exact sum only by (a) its accumulation, (b) the one fp32 product with alpha, (c) the one
//    rounding to bf16 / fp16. (c) is at most 2^-8 |result| (bf16, round to nearest; fp16 2^-11): 2^-7 |ref| leaves
//    a factor 2. (a) is at most (K / 16) 2^-24 mag for IEEE fp32 accumulation (2^-15 mag at K = 512), but the FP4
//    tensor core's internal accumulation is not documented to be IEEE fp32 (Hopper's FP8 MMA keeps ~14 bits), so
//    2^-9 mag allows 16 additions each losing 2^-13 of the magnitude; (b) is 2^-24 |ref|.
//  - the reference's own error is (a) for IEEE fp32: 2^-15 mag at the check's K, far inside the bound.
// What the bound still catches: at K = 512 mag is about 512 E|term|, so the mag allowance is about one term; a wrong
// scale, a swapped nibble, a misread swizzle or a dropped K tile moves an output by a group's sum (~16 terms) or by
// sqrt(K) terms of noise.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "native_reference.h"
#include "../common/check_kernels.cuh"
#include "../common/convert.cuh"

namespace blockfp8::fp4::native {
namespace {

constexpr int kThreads = 256;

// E2M1 code (low 4 bits; bit 3 the sign): exponent e = bits 1-2, mantissa m = bit 0; e == 0 -> 0.5 m (subnormal),
// else 2^(e - 1) (1 + m / 2). Arithmetic, not a table: the same on every arch.
__device__ __forceinline__ float e2m1(uint32_t code) {
  const int e = int((code >> 1) & 3u);
  const float m = float(code & 1u);
  const float mag = e == 0 ? 0.5f * m : ldexpf(1.f + 0.5f * m, e - 1);
  return (code & 8u) ? -mag : mag;
}

__global__ void reference_kernel(const GemmProblem p, float* ref, float* mag) {
  const int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e >= p.m * p.n) return;
  const int64_t row = e / p.n, col = e % p.n, groups = p.k / kGroup, cols = sf_cols(p.k);
  const uint8_t* a = p.a + row * (p.k / 2);
  const uint8_t* b = p.b + col * (p.k / 2);
  float acc = 0.f, acc_abs = 0.f;
  for (int64_t g = 0; g < groups; ++g) {
    float dot = 0.f, dot_abs = 0.f;
    for (int j = 0; j < kGroup / 2; ++j) {  // byte j of the group: element 2j in the low nibble (ModelOpt packing)
      const uint32_t va = a[g * (kGroup / 2) + j], vb = b[g * (kGroup / 2) + j];
      const float lo = e2m1(va & 15u) * e2m1(vb & 15u), hi = e2m1(va >> 4) * e2m1(vb >> 4);
      dot += lo + hi;
      dot_abs += fabsf(lo) + fabsf(hi);
    }
    const float scale =
        e4m3_to_float(p.a_sf[sf_offset(row, g, cols)]) * e4m3_to_float(p.b_sf[sf_offset(col, g, cols)]);
    acc += dot * scale;
    acc_abs += dot_abs * fabsf(scale);
  }
  const float alpha = *p.alpha;
  const float out = acc * alpha;
  if (p.d != nullptr) {
    if (p.bf16)
      static_cast<__nv_bfloat16*>(p.d)[e] = __float2bfloat16_rn(out);
    else
      static_cast<__half*>(p.d)[e] = __float2half_rn(out);
  }
  if (ref != nullptr) ref[e] = out;
  if (mag != nullptr) mag[e] = acc_abs * fabsf(alpha);
}

// An in-range scale: positive e4m3 with exponent field 3..6 (2^-4 .. 2^-1 with bias 7) and any mantissa.
__device__ __forceinline__ uint8_t check_scale(uint32_t h) { return uint8_t(((3u + (h & 3u)) << 3) | ((h >> 2) & 7u)); }

// Element i of the flat index space [a bytes | b bytes | a scales (padded) | b scales (padded)]; each part's hash
// stream is offset so that A and B differ.
__global__ void fill_kernel(const GemmProblem p) {
  const int64_t a_bytes = p.m * (p.k / 2), b_bytes = p.n * (p.k / 2), cols = sf_cols(p.k), groups = p.k / kGroup;
  const int64_t a_sf = sf_rows(p.m) * cols, b_sf = sf_rows(p.n) * cols;
  const int64_t total = a_bytes + b_bytes + a_sf + b_sf;
  uint8_t* a = const_cast<uint8_t*>(p.a);
  uint8_t* b = const_cast<uint8_t*>(p.b);
  uint8_t* sa = const_cast<uint8_t*>(p.a_sf);
  uint8_t* sb = const_cast<uint8_t*>(p.b_sf);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t h = check::mix(uint32_t(i) * 2654435761u + 0x9e3779b9u);
    if (i < a_bytes) {
      a[i] = uint8_t(h);  // two codes; every 4-bit pattern is a valid E2M1 value
    } else if (i < a_bytes + b_bytes) {
      b[i - a_bytes] = uint8_t(h);
    } else {
      const bool is_a = i < a_bytes + b_bytes + a_sf;
      const int64_t j = is_a ? i - a_bytes - b_bytes : i - a_bytes - b_bytes - a_sf;
      const int64_t r = j / cols, c = j % cols, rows = is_a ? p.m : p.n;
      (is_a ? sa : sb)[sf_offset(r, c, cols)] = (r < rows && c < groups) ? check_scale(h) : uint8_t(0);
    }
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) *const_cast<float*>(p.alpha) = 0.8125f;
}

unsigned blocks_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return unsigned(blocks < 4096 ? blocks : 4096);  // grid-stride beyond
}

}  // namespace

cudaError_t launch_reference(const GemmProblem& p, float* ref, float* mag, cudaStream_t s) {
  if (p.k <= 0 || p.k % kGroup != 0 || p.m < 0 || p.n < 0) return cudaErrorInvalidValue;
  if (p.m == 0 || p.n == 0) return cudaSuccess;
  const int64_t total = p.m * p.n;
  reference_kernel<<<unsigned((total + kThreads - 1) / kThreads), kThreads, 0, s>>>(p, ref, mag);
  return cudaGetLastError();
}

cudaError_t launch_fill_check_problem(const GemmProblem& p, cudaStream_t s) {
  if (p.k <= 0 || p.k % kGroup != 0 || p.m <= 0 || p.n <= 0) return cudaErrorInvalidValue;
  fill_kernel<<<blocks_for(p.m * (p.k / 2) + p.n * (p.k / 2)), kThreads, 0, s>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_compare(const GemmProblem& p, const float* ref, const float* mag, bool corrupt, unsigned* result,
                           cudaStream_t s) {
  if (p.m <= 0 || p.n <= 0) return cudaErrorInvalidValue;
  return check::launch_compare(p.d, p.bf16, p.m * p.n, ref, mag, corrupt, result, s);
}

}  // namespace blockfp8::fp4::native
