// Activation quantizer and weight dequantizer (raw pointers; no torch types).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace blockfp8::quant {

// x [m, k] 16-bit row-major (row stride x_stride elements) -> q fp8 e4m3 [m, k] contiguous and
// scales fp32 M-major: s[g * s_ld + row] for group g = k-index / 128, s_ld >= m.
struct TokenGroupProblem {
  const void* x;
  uint8_t* q;
  float* s;
  int64_t m, k, x_stride, s_ld;
  bool bf16;
};
cudaError_t launch_per_token_group(const TokenGroupProblem& p, cudaStream_t stream);

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
