// Weight-only block-FP8 decode GEMV: the C++ boundary between ops.cpp and the kernels.
//
//   out[m, n] = sum_kb (sum_{k in block kb} x[m, k] * fp8(b[n, k])) * b_scale[n / 128, kb]
//
// x       bf16 or fp16 [m, k], row-major, row stride x_stride elements (K contiguous).
// b       fp8 e4m3 [n, k] row-major contiguous (K-major weight), 16-byte aligned.
// b_scale fp32 [ceil(n / 128), ceil(k / 128)] contiguous; multiplies to dequantize.
// out     x's dtype, [m, n], row stride out_stride elements. Written in full, never read.
// Accumulation is fp32; the block scale is applied once per partial sum of a 128-wide K block.
//
// Valid problems: k % 16 == 0 (16-byte weight loads), m, n, k < 2^30, b 16-byte aligned,
// x 2-byte aligned. Every row but the last also needs 16-byte aligned x rows (x data pointer
// % 16 == 0 and x_stride % 8 == 0); the last row takes any valid problem.
// No torch types here: ops.cpp converts tensors into a Problem.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "../common/tile_row.h"

namespace blockfp8::gemv {

struct Problem {
  const void* x = nullptr;         // bf16/fp16 [m, k], row stride x_stride
  const uint8_t* b = nullptr;      // fp8 e4m3 [n, k] contiguous
  const float* b_scale = nullptr;  // fp32 [ceil(n / 128), ceil(k / 128)] contiguous
  void* out = nullptr;             // x's dtype [m, n], row stride out_stride
  int64_t m = 0, n = 0, k = 0;
  int64_t x_stride = 0, out_stride = 0;  // in elements
  bool bf16 = true;                      // false: fp16 (x and out)
  int sm_count = 0;                      // multiprocessors (residency pin, gemv_mma_t16_ks32 precondition)
};

// Rows of the table in selection order (data at the top of sm80.cu; the last one is unbounded).
int num_rows();
const TileRow& row(int i);

// nullptr if row i can run p, else a sentence saying why not (static storage, never freed).
// Reads pointers only for their alignment, so a Problem with null pointers can be asked.
const char* rejects(int i, const Problem& p);

// First row with max_m >= p.m that does not reject p; -1 if none.
int select(const Problem& p);

// Enqueues row i on stream s. Never synchronizes and never allocates (CUDA-graph capturable).
// Returns cudaErrorInvalidValue if rejects(i, p) != nullptr, cudaSuccess without a launch when
// m == 0 or n == 0, otherwise cudaGetLastError() after the launch.
cudaError_t launch(int i, const Problem& p, cudaStream_t s);

// Warps per tensor-core block, each taking a strided share of the 64-wide K windows. Above
// 8192 columns the ceil(n / 16) blocks already fill the GPU and 8 warps measured faster; below
// it 16 warps restore the memory-level parallelism the fewer blocks lack (seed 000, sec 6.1).
constexpr int ksplit(int64_t n) { return n >= 8192 ? 8 : 16; }

// Whether the tensor-core GEMV launches its residency-pinned entry point (the same body under
// __launch_bounds__(32 * ksplit, 3): a 40-register cap that fits 3 blocks per SM instead of 2).
// Every condition was measured on H200 (seed 003):
//  - column_blocks <= 2 * sm_count: already one wave; the cap only costs (0.96x at 64 blocks);
//  - column_blocks > 3 * sm_count: multi-wave either way;
//  - ksplit != 16: 8-warp blocks lose 1.05-1.08x from any explicit __launch_bounds__;
//  - m_tiles != 1: two token tiles spill under 40 registers (0.74x at M = 16).
// Pure host logic so tests can evaluate it at a fixed sm_count (132 = H200).
constexpr bool pins_residency(int64_t column_blocks, int sm_count, int ksplit, int m_tiles) {
  return ksplit == 16 && m_tiles == 1 && column_blocks > 2 * int64_t(sm_count) &&
         column_blocks <= 3 * int64_t(sm_count);
}

}  // namespace blockfp8::gemv
