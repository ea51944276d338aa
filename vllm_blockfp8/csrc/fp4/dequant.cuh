// The NVFP4 weight in the fragment packing dequantized to a 16-bit [n, k] matrix, for the large-M row that multiplies
// it with cuBLAS (the op, ops.cpp, runs the matmul; this kernel only writes the weight):
//
//   w[n, k] = round16(global_scale[n] * e2m1(code[n, k]) * scale[n, k / 16])
//
// Layouts: b and b_scale in the fragment packing (fragment.cuh: per 16-row tile and 64-deep stage one 512-byte block
// of codes and one 64-byte block of exp8 scales); global_scale fp32 [n] (stride 1) or one value (stride 0); w bf16 or
// fp16 [n, k] row-major (K contiguous), 16-byte aligned. One warp per (tile, stage) block: each lane loads its 16
// bytes and its lane group's 8 scales, decodes its four A fragments (fragment_step: e2m1 * scale * 2^-7, exact),
// multiplies by global_scale * 2^7 in fp32 and rounds once to 16 bits, which is the only rounding of a weight: e2m1 *
// scale alone is exact in both types, its product with an fp32 global scale is not. The fragments go through shared
// memory (rows padded to 144 bytes: the 4-byte stores of a warp hit 32 distinct banks) so that global stores are
// whole 128-byte rows. Arch: SM80+ (the decode is fragment.cuh's). Unsupported: the row-contiguous packings.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "../common/sm80.cuh"
#include "fragment.cuh"

namespace blockfp8::fp4 {

constexpr int kDequantWarps = 8;              // warps (fragment blocks) per CTA
constexpr int kDequantPitch = kFragK + 8;     // 16-bit elements per staged row: 144 bytes

template <typename T>
__device__ __forceinline__ uint32_t scaled_pair(uint32_t f, float s);
template <>
__device__ __forceinline__ uint32_t scaled_pair<__nv_bfloat16>(uint32_t f, float s) {
  const float2 v = __bfloat1622float2(sm80::bit_cast<__nv_bfloat162>(f));
  return sm80::bit_cast<uint32_t>(__floats2bfloat162_rn(v.x * s, v.y * s));
}
template <>
__device__ __forceinline__ uint32_t scaled_pair<__half>(uint32_t f, float s) {
  const float2 v = __half22float2(sm80::bit_cast<__half2>(f));
  return sm80::bit_cast<uint32_t>(__floats2half2_rn(v.x * s, v.y * s));
}

template <typename T>
__global__ void __launch_bounds__(32 * kDequantWarps) dequant_fragment_kernel(
    const uint8_t* __restrict__ b, const uint8_t* __restrict__ b_scale, const float* __restrict__ global_scale,
    int64_t global_scale_stride, T* __restrict__ w, int64_t n, int64_t k) {
  __shared__ __align__(16) uint16_t staged[kDequantWarps][kFragRows][kDequantPitch];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int64_t stages = k / kFragK, blocks = (n / kFragRows) * stages;
  const int64_t block = int64_t(blockIdx.x) * kDequantWarps + warp;
  if (block >= blocks) return;  // warp-local from here on: no CTA barrier below
  const int64_t tile = block / stages, stage = block % stages;
  const uint4 codes = sm80::load_weight(reinterpret_cast<const uint4*>(b) + block * kFragBlockWords + lane);
  const uint2 scales = __ldg(reinterpret_cast<const uint2*>(b_scale) + block * kFragScaleWords + g);
  const int64_t row0 = tile * kFragRows + g;
  const float s0 = global_scale[row0 * global_scale_stride] * 128.0f;        // 2^7: the decode's e2m1 * scale * 2^-7
  const float s1 = global_scale[(row0 + 8) * global_scale_stride] * 128.0f;  // row g + 8
  uint16_t(*rows)[kDequantPitch] = staged[warp];
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    uint32_t f[4];
    fragment_step<T>(codes, scales, kk, f);
    const int col = 16 * kk + 2 * t;  // f[0], f[1]: k col, col + 1; f[2], f[3]: col + 8, col + 9
    *reinterpret_cast<uint32_t*>(&rows[g][col]) = scaled_pair<T>(f[0], s0);
    *reinterpret_cast<uint32_t*>(&rows[g + 8][col]) = scaled_pair<T>(f[1], s1);
    *reinterpret_cast<uint32_t*>(&rows[g][col + 8]) = scaled_pair<T>(f[2], s0);
    *reinterpret_cast<uint32_t*>(&rows[g + 8][col + 8]) = scaled_pair<T>(f[3], s1);
  }
  __syncwarp();
  // 16 rows x 128 bytes: 4 passes of 4 rows, 8 lanes per row, 16 bytes each.
  T* out = w + (tile * kFragRows) * k + stage * kFragK;
#pragma unroll
  for (int pass = 0; pass < 4; ++pass) {
    const int r = 4 * pass + (lane >> 3), c = 8 * (lane & 7);
    *reinterpret_cast<uint4*>(out + int64_t(r) * k + c) = *reinterpret_cast<const uint4*>(&rows[r][c]);
  }
}

}  // namespace blockfp8::fp4
