// The arch-neutral reference W8A8 block-FP8 GEMM and the self-check's device helpers (reference.h).
//
//   D[m, n] = sum_kb (sum_{k in block kb} A[m, k] * B[n, k]) * SFA[m, kb] * SFB[n / 128, kb]
//
// Layouts as gemm.h (A, B fp8 e4m3 K-major; SFA M-major with ld; SFB [ceil(n/128), k/128]; D row-major). Any arch
// the build targets (plain CUDA, software fp8 decode): the fallback of a row whose first-use check failed and the
// reference of that check. One thread per output, fp32 throughout: exact fp8 products, one fp32 sum per 128 block,
// promoted once per block. Unsupported: k % 128 != 0 (the callers never pass one).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "reference.h"
#include "../common/check_kernels.cuh"
#include "../common/convert.cuh"

namespace blockfp8::gemm {
namespace {

__global__ void reference_kernel(const Problem p, float* ref, float* abs_dot) {
  const int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (e >= p.m * p.n) return;
  const int64_t row = e / p.n, col = e % p.n, kblocks = p.k / 128;
  const uint8_t* a = static_cast<const uint8_t*>(p.a) + row * p.k;
  const uint8_t* b = static_cast<const uint8_t*>(p.b) + col * p.k;
  float acc = 0.f, mag = 0.f;
  for (int64_t kb = 0; kb < kblocks; ++kb) {
    float dot = 0.f, dot_abs = 0.f;
    for (int i = 0; i < 128; ++i) {
      const float prod = e4m3_to_float(a[kb * 128 + i]) * e4m3_to_float(b[kb * 128 + i]);
      dot += prod;
      dot_abs += fabsf(prod);
    }
    const float scale = p.a_scale[kb * p.a_scale_ld + row] * p.b_scale[(col / 128) * kblocks + kb];
    acc += dot * scale;
    mag += dot_abs * fabsf(scale);
  }
  if (p.d != nullptr) {
    if (p.out_bf16)
      static_cast<__nv_bfloat16*>(p.d)[e] = __float2bfloat16_rn(acc);
    else
      static_cast<__half*>(p.d)[e] = __float2half_rn(acc);
  }
  if (ref != nullptr) ref[e] = acc;
  if (abs_dot != nullptr) abs_dot[e] = mag;
}

__global__ void fill_kernel(const Problem p) {
  const int64_t kblocks = p.k / 128, a_bytes = p.m * p.k, b_bytes = p.n * p.k;
  const int64_t sa = p.a_scale_ld * kblocks, sb = (p.n + 127) / 128 * kblocks;
  const int64_t total = a_bytes + b_bytes + sa + sb;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t h = check::mix(uint32_t(i) * 2654435761u + 12345u);
    if (i < a_bytes + b_bytes) {
      // e4m3: sign, exponent 5..8 (2^-2 .. 2^1 with bias 7), any mantissa: no NaN (exponent 15), no zero.
      const uint8_t v = uint8_t(((h & 1u) << 7) | ((5u + ((h >> 1) & 3u)) << 3) | ((h >> 3) & 7u));
      if (i < a_bytes)
        const_cast<uint8_t*>(static_cast<const uint8_t*>(p.a))[i] = v;
      else
        const_cast<uint8_t*>(static_cast<const uint8_t*>(p.b))[i - a_bytes] = v;
    } else {
      const float s = ldexpf(1.f + float(h & 1023u) / 1024.f, -6 - int((h >> 10) & 1u));
      if (i < a_bytes + b_bytes + sa)
        const_cast<float*>(p.a_scale)[i - a_bytes - b_bytes] = s;
      else
        const_cast<float*>(p.b_scale)[i - a_bytes - b_bytes - sa] = s;
    }
  }
}

int blocks_for(int64_t n) { return int((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096); }

}  // namespace

cudaError_t launch_reference(const Problem& p, float* ref, float* abs_dot, cudaStream_t s) {
  if (p.m <= 0 || p.n <= 0) return cudaSuccess;
  if (p.k % 128 != 0 || p.k <= 0) return cudaErrorInvalidValue;
  const int64_t total = p.m * p.n;
  reference_kernel<<<unsigned((total + 255) / 256), 256, 0, s>>>(p, ref, abs_dot);
  return cudaGetLastError();
}

cudaError_t launch_fill_check_problem(const Problem& p, cudaStream_t s) {
  fill_kernel<<<blocks_for(p.m * p.k + p.n * p.k), 256, 0, s>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_compare(const Problem& p, const float* ref, const float* abs_dot, bool corrupt, unsigned* result,
                           cudaStream_t s) {
  return check::launch_compare(p.d, p.out_bf16, p.m * p.n, ref, abs_dot, corrupt, result, s);
}

}  // namespace blockfp8::gemm
