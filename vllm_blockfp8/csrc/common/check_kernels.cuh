// Device pieces every first-use check shares (gemm/reference_kernel.cu, fp4/native_reference.cu): the hash that makes
// a check problem deterministic, and the comparison of a row's 16-bit output with the reference's fp32 result.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace blockfp8::check {

// A 32-bit integer hash (lowbias32): element i of a check problem is derived from mix(i * odd + seed).
__device__ __forceinline__ uint32_t mix(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// Compares `count` outputs d (bf16 or fp16) with ref: element e fails unless |d - ref| <= 2^-7 |ref| + 2^-9 mag[e]
// (mag: the family's magnitude sum, the accumulation's error scale); NaN fails, and an element whose tolerance is 0
// (every product 0) must be exactly 0. result[0] += failing elements, result[1] = max(|d - ref| / tolerance) as
// float bits; the caller zeroes result. corrupt: element 0 is read as d + mag + 1 (the test switch's forced mismatch).
cudaError_t launch_compare(const void* d, bool bf16, int64_t count, const float* ref, const float* mag, bool corrupt,
                           unsigned* result, cudaStream_t s);

}  // namespace blockfp8::check
