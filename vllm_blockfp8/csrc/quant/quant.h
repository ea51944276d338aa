// Activation quantizer and weight dequantizer (raw pointers; no torch types).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../common/tile_row.h"

namespace blockfp8::quant {

// x [m, k] 16-bit row-major (row stride x_stride elements) -> q fp8 e4m3 [m, k] contiguous and
// scales fp32 M-major: s[g * s_ld + row] for group g = k-index / 128, s_ld >= m.
// Valid problems: k % 128 == 0, s_ld >= m, x rows 16-byte aligned (x % 16 == 0 and x_stride % 8
// == 0 when m > 1; any x_stride >= 0, rows may overlap), q 8-byte aligned.
struct TokenGroupProblem {
  const void* x = nullptr;
  uint8_t* q = nullptr;
  float* s = nullptr;
  int64_t m = 0, k = 0, x_stride = 0, s_ld = 0;
  bool bf16 = true;
  // Execute griddepcontrol.launch_dependents at the start (SM90+): a kernel launched after this one with
  // programmatic dependent launch (the SM90 GEMM) may then launch and set up while this one runs.
  bool trigger_dependents = false;
};

// Rows of the quantizer's table in selection order (data at the top of quant.cu; the table is
// the same on every arch). The first row is unbounded, so rows after it are forced-only.
int num_rows();
const TileRow& row(int i);
// nullptr if row i can run p, else why not (static storage). Reads pointers only for alignment.
const char* rejects(int i, const TokenGroupProblem& p);
// First row with max_m >= p.m that does not reject p; -1 if none.
int select(const TokenGroupProblem& p);
// Enqueues row i on stream s: never synchronizes, never allocates (CUDA-graph capturable).
// cudaErrorInvalidValue if row i rejects p; cudaSuccess without a launch when m or k is 0.
cudaError_t launch(int i, const TokenGroupProblem& p, cudaStream_t stream);

// w[n, k] = fp8(b[n, k]) * b_scale[n / 128, k / 128] in 16-bit, k % 16 == 0.
struct DequantProblem {
  const uint8_t* b;
  const float* b_scale;
  void* w;
  int64_t n, k;
  bool bf16;
};
cudaError_t launch_dequant_weight(const DequantProblem& p, cudaStream_t stream);

// out[m, n] += bias[n] in 16-bit (out row-major contiguous), for paths without a fused epilogue.
struct BiasProblem {
  void* out;
  const void* bias;
  int64_t m, n;
  bool bf16;
};
cudaError_t launch_add_bias(const BiasProblem& p, cudaStream_t stream);

}  // namespace blockfp8::quant
