// Per-token-group quantization of one 128-value group held by 16 lanes (8 values each): the
// arithmetic shared by the standalone quantizer (quant.cu) and the GEMM that quantizes its own
// activations (gemm/sm90_fused_quant.cuh), so both write the same bits.
//
// Math (bit-exact with reference.quantize_per_token_group): scale = max(amax, 1e-10) / 448 (fp32),
// q = e4m3_satfinite_rn(x / scale) correctly rounded as by IEEE fp32 division (do not build with
// fast-math). The quotient is x * RN(1 / scale) plus one FMA correction step (corrected_quotient).
// Arch: SM80+ (the e4m3 conversion is one instruction from SM89 on).
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

namespace blockfp8::quant {

constexpr int kGroup = 128;
constexpr int kLanesPerGroup = 16;  // 16 lanes x 8 values = one group
constexpr float kFp8Max = 448.0f;
constexpr float kAmaxFloor = 1e-10f;
// Below this |x * RN(1 / scale)| the IEEE division (see corrected_quotient).
constexpr float kE4m3MinNormal = 0x1p-6f;

// RN(x / scale) for a pair of values from r = RN(1 / scale), no division per value. Markstein: if y =
// RN(1/b) and q is within 1 ulp of a/b, then rem = a - b q is exact in one FMA and RN(q + rem y) =
// RN(a/b), with a, b, q and the result normal. Here b = scale, y = r (__frcp_rn, relative error
// <= 2^-24) and q = p = RN(x r). p is within 1.5 ulp of x / scale but past 1 ulp for ~1% of 16-bit
// (x, amax) pairs (rem then may round), which the theorem does not cover; those are exact too, as
// this is CUDA's own div.rn.f32 fast path (its MUFU.RCP and Newton step are __frcp_rn's fast path,
// then x * y, the same two FFMAs), and the CPU emulation of every 16-bit significand pair in
// tests/test_quant_fast_quotient.py reproduces the quotient's bits. Ranges: scale > 2^-43 and
// |p| < 448.1, so for |p| >= 2^-6 nothing leaves fp32's normal range (rem is a multiple of
// ulp(p) ulp(scale) >= 2^-95). The guard sends |p| < 2^-6 to the division: zeros (the FMAs would turn
// -0 into +0), fp32-subnormal x, e4m3-subnormal quotients, and NaN (fails the >=). Per pair, as the
// conversion takes pairs: 4 branches per lane instead of 8.
__device__ __forceinline__ float2 corrected_quotient(float x0, float x1, float scale, float r) {
  const float p0 = __fmul_rn(x0, r), p1 = __fmul_rn(x1, r);  // not contracted: the FMAs need p itself
  if (!(fabsf(p0) >= kE4m3MinNormal && fabsf(p1) >= kE4m3MinNormal))
    return make_float2(x0 / scale, x1 / scale);
  return make_float2(__fmaf_rn(__fmaf_rn(-p0, scale, x0), r, p0), __fmaf_rn(__fmaf_rn(-p1, scale, x1), r, p1));
}

// The group's amax over its 16 lanes (every lane of the 16 must call it: rows past M pass zeros).
__device__ __forceinline__ float group_amax(const float (&v)[8]) {
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
  for (int offset = kLanesPerGroup / 2; offset > 0; offset /= 2)
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset, kLanesPerGroup));
  return amax;
}

__device__ __forceinline__ float group_scale(float amax) { return fmaxf(amax, kAmaxFloor) / kFp8Max; }

// This lane's 8 values as e4m3 (value i in byte i).
__device__ __forceinline__ uint2 quantize8(const float (&v)[8], float scale) {
  uint2 packed;
  const float r = __frcp_rn(scale);  // one correctly rounded reciprocal per lane and group
  __nv_fp8x2_storage_t* out = reinterpret_cast<__nv_fp8x2_storage_t*>(&packed);
#pragma unroll
  for (int i = 0; i < 8; i += 2)  // .x goes to the low byte
    out[i / 2] = __nv_cvt_float2_to_fp8x2(corrected_quotient(v[i], v[i + 1], scale, r), __NV_SATFINITE, __NV_E4M3);
  return packed;
}

}  // namespace blockfp8::quant
