// The arch-neutral reference of the native NVFP4 x NVFP4 GEMM (native_reference.cu, compiled for every arch in the
// build) and the device helpers of the native rows' first-use self-check (first_use.cpp): a deterministic check
// problem and the comparison. Slow and simple on purpose: it is the yardstick of the check (and the direct GEMM op's
// fallback for a row that failed it), and the H200 can test it although the native rows run on SM120 only.
#pragma once

#include <cuda_runtime_api.h>

#include "native.h"

namespace blockfp8::fp4::native {

// out[m, n] = alpha * sum_k e2m1(a[m, k]) * sa[m, k / 16] * e2m1(b[n, k]) * sb[n, k / 16] for p's operands and
// layouts (native.h; any m, n >= 1, k % 16 == 0, no alignment needed), one thread per output: each 16-value group's
// dot in fp32 (exact: products of two e2m1 are multiples of 1/4 up to 36, a group's sum stays below 2^10), scaled by
// sa * sb (exact: 8 significant bits) and added in fp32, times alpha once. Writes p.d (p.bf16) where non-null, and
// where given the fp32 result `ref` and `mag` = |alpha| * sum_k |a| |b| sa sb (the tolerance's scale), both [m, n]
// row-major.
cudaError_t launch_reference(const GemmProblem& p, float* ref, float* mag, cudaStream_t s);

// Fills p's a, b (every nibble a hash-derived E2M1 code, signed zeros included), a_sf, b_sf (swizzled; in-range
// scales positive e4m3 in [2^-4, 0.9375], padding bytes 0 as the quantizer writes them) and *alpha = 0.8125 (not a
// power of two, so a dropped alpha shows): a deterministic problem for a row's first-use check. Outputs stay far
// inside fp16's range at the check's K.
cudaError_t launch_fill_check_problem(const GemmProblem& p, cudaStream_t s);

// Compares D (p.d, bf16 / fp16 by p.bf16) to `ref`: element e fails unless |D - ref| <= 2^-7 |ref| + 2^-9 mag (NaN
// fails; the bound and why: native_reference.cu). result[0] = failing elements, result[1] = the largest
// |D - ref| / tolerance as float bits; the caller zeroes both. corrupt: the check's test switch, element 0 is read as
// D + mag + 1 (a forced mismatch).
cudaError_t launch_compare(const GemmProblem& p, const float* ref, const float* mag, bool corrupt, unsigned* result,
                           cudaStream_t s);

}  // namespace blockfp8::fp4::native
