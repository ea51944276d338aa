// The first-use checks' comparison kernel (check_kernels.cuh). Arch-neutral: compiled for every arch in the build.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "check_kernels.cuh"

namespace blockfp8::check {
namespace {

__global__ void compare_kernel(const void* d_out, bool bf16, int64_t count, const float* ref, const float* mag,
                               bool corrupt, unsigned* result) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < count; e += int64_t(gridDim.x) * blockDim.x) {
    float d = bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(d_out)[e])
                   : __half2float(static_cast<const __half*>(d_out)[e]);
    if (corrupt && e == 0) d += mag[e] + 1.f;
    const float tol = ldexpf(fabsf(ref[e]), -7) + ldexpf(mag[e], -9);
    const float diff = fabsf(d - ref[e]);
    const float ratio = tol > 0.f ? diff / tol : (diff == 0.f ? 0.f : INFINITY);
    if (!(ratio <= 1.f)) {
      atomicAdd(&result[0], 1u);
      atomicMax(&result[1], __float_as_uint(ratio == ratio ? ratio : INFINITY));  // non-negative: ordered as bits
    } else {
      atomicMax(&result[1], __float_as_uint(ratio));
    }
  }
}

}  // namespace

cudaError_t launch_compare(const void* d, bool bf16, int64_t count, const float* ref, const float* mag, bool corrupt,
                           unsigned* result, cudaStream_t s) {
  if (count <= 0) return cudaErrorInvalidValue;
  const int64_t blocks = (count + 255) / 256;
  compare_kernel<<<unsigned(blocks < 4096 ? blocks : 4096), 256, 0, s>>>(d, bf16, count, ref, mag, corrupt, result);
  return cudaGetLastError();
}

}  // namespace blockfp8::check
