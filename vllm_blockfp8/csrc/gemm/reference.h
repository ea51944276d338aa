// The arch-neutral reference W8A8 GEMM (reference_kernel.cu, compiled for every arch in the build) and the device
// helpers of the first-use self-check (first_use.cpp): deterministic operands and the comparison. Slow and simple on
// purpose: it is the fallback of a row that failed its check, and the yardstick of the check.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "gemm.h"

namespace blockfp8::gemm {

// D = the GEMM of p (gemm.h's math and layouts; any m, n >= 1, k % 128 == 0), one thread per output element: fp8
// decoded to fp32, each 128-wide block's dot in fp32, promoted by SFA * SFB. Writes p.d (p.out_bf16) where non-null,
// and where given the fp32 result `ref` and `abs_dot` = sum_kb |A| . |B| * |SFA * SFB| (the tolerance's scale), both
// [m, n] row-major.
cudaError_t launch_reference(const Problem& p, float* ref, float* abs_dot, cudaStream_t s);

// Fills A [m, k], B [n, k] with hash-derived e4m3 values in +-[1/4, 3.75] (no NaN), SFA (M-major, ld) and SFB
// ([ceil(n/128), k/128]) with scales in [2^-6, 2^-4): a sane, deterministic problem for a row's first-use check.
cudaError_t launch_fill_check_problem(const Problem& p, cudaStream_t s);

// Compares D (bf16 / fp16) to `ref` (common/check_kernels.cuh): element e fails unless
// |D - ref| <= 2^-7 |ref| + 2^-9 abs_dot (NaN fails).
// result[0] = failing elements, result[1] = the largest |D - ref| / tolerance as float bits; the caller zeroes it.
// corrupt: the check's test switch, element 0 is read as D + abs_dot + 1 (a forced mismatch).
cudaError_t launch_compare(const Problem& p, const float* ref, const float* abs_dot, bool corrupt, unsigned* result,
                           cudaStream_t s);

}  // namespace blockfp8::gemm
