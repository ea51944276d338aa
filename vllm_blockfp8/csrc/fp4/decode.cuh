// E2M1 (NVFP4) decoding to 16-bit mma operands, shared by the FP4 GEMV and the W4A16 GEMM.
//
// A packed word q holds 8 codes, nibble j = element j (ModelOpt: element 2i in byte i's low
// nibble). decode_word() returns its four pairs P[j] = (element j, element j + 4) as 16-bit
// pairs (low half = element j): sign to bit 15, (exponent, mantissa) to the bottom of the 16-bit
// exponent field. The bits then read e2m1 * 2^-14 as f16 and e2m1 * 2^-126 as bf16, the code 0.5
// landing on a subnormal: exact in both (PTX fma.rn.{f16,bf16}x2 keep subnormals).
// scaled_pairs() multiplies them by (e4m3 scale * 2^c), c = 7 for f16 and 119 for bf16, so every
// mma operand is e2m1 * scale * 2^-7 exactly: the product has at most 2 x 4 significant bits, is
// at least 0.5 * 2^-9 * 2^-7 = 2^-17 (f16's subnormal grid is 2^-24) and at most 6 * 448 * 2^-7
// = 21. The kernels multiply their fp32 sums by global_scale * 2^7 (kUnbias) once per output.
//
// Three packings of the weight reach the kernels (fp4.h, Problem::packing). ModelOpt's (the checkpoint's; the SM120
// native GEMM reads it) decodes through decode_word() above. The paired packing (reference.pair_nvfp4_weight,
// made once at load) permutes each word's bits so that pair j = (element 2j, element 2j + 1) comes out of one
// rotate and one mask as the same bf16 bits: 9 instructions per word instead of 15, and consecutive elements, so
// the GEMV feeds x to the mma as it is loaded (no regrouping). The fragment packing (fragment.cuh) holds paired
// words whose 4 pairs are a lane's mma A fragment. decode_paired() produces exactly decode_word()'s operand bits
// for the same elements, so every numerical statement above holds for all three.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "../common/sm80.cuh"

namespace blockfp8::fp4 {

constexpr float kUnbias = 128.f;  // 2^7, see above

template <typename T>
struct E2m1Shift;  // how far a code's bits 12-14 move down to the bottom of T's exponent
template <>
struct E2m1Shift<__half> {
  static constexpr int value = 3;
};
template <>
struct E2m1Shift<__nv_bfloat16> {
  static constexpr int value = 6;
};

template <typename T>
__device__ __forceinline__ uint32_t pair_of_top_nibbles(uint32_t q) {
  return (q & 0x80008000u) | ((q & 0x70007000u) >> E2m1Shift<T>::value);
}

// P[j] = (element j, element j + 4) of word q, unscaled (see the header).
template <typename T>
__device__ __forceinline__ void decode_word(uint32_t q, uint32_t (&p)[4]) {
  p[3] = pair_of_top_nibbles<T>(q);
  p[2] = pair_of_top_nibbles<T>(q << 4);
  p[1] = pair_of_top_nibbles<T>(q << 8);
  p[0] = pair_of_top_nibbles<T>(q << 12);
}

template <typename T>
__device__ __forceinline__ uint32_t mul2(uint32_t a, uint32_t b);
template <>
__device__ __forceinline__ uint32_t mul2<__half>(uint32_t a, uint32_t b) {
  return sm80::bit_cast<uint32_t>(__hmul2(sm80::bit_cast<__half2>(a), sm80::bit_cast<__half2>(b)));
}
template <>
__device__ __forceinline__ uint32_t mul2<__nv_bfloat16>(uint32_t a, uint32_t b) {
  return sm80::bit_cast<uint32_t>(
      __hmul2(sm80::bit_cast<__nv_bfloat162>(a), sm80::bit_cast<__nv_bfloat162>(b)));
}

// Two e4m3 scales (low byte first) -> {scale0 * 2^c, scale0 * 2^c}, {scale1 * 2^c, scale1 * 2^c}
// as T pairs (both halves equal: they multiply a decoded pair of one 16-value group).
template <typename T>
__device__ __forceinline__ void scale_pairs(uint32_t two, uint32_t& s0, uint32_t& s1);
template <>
__device__ __forceinline__ void scale_pairs<__half>(uint32_t two, uint32_t& s0, uint32_t& s1) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), __NV_E4M3);
  // x 2^7 is exact: 448 * 128 = 57344 is below f16's 65504.
  const uint32_t v = mul2<__half>(uint32_t(h.x) | (uint32_t(h.y) << 16), 0x58005800u);
  s0 = __byte_perm(v, v, 0x1010);
  s1 = __byte_perm(v, v, 0x3232);
}
template <>
__device__ __forceinline__ void scale_pairs<__nv_bfloat16>(uint32_t two, uint32_t& s0, uint32_t& s1) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), __NV_E4M3);
  const float2 f = __half22float2(sm80::bit_cast<__half2>(uint32_t(h.x) | (uint32_t(h.y) << 16)));
  // x 2^119 in fp32 is exact (448 * 2^119 = 1.75 * 2^127 < bf16's max), and so is keeping the high
  // half: an e4m3 value has 4 significant bits.
  const float two119 = __uint_as_float(0x7b000000u);
  const uint32_t u0 = __float_as_uint(f.x * two119), u1 = __float_as_uint(f.y * two119);
  s0 = (u0 & 0xffff0000u) | (u0 >> 16);
  s1 = (u1 & 0xffff0000u) | (u1 >> 16);
}

// Word q decoded and scaled: A[j] = (element j, element j + 4) * scale * 2^-7.
template <typename T>
__device__ __forceinline__ void decode_scaled(uint32_t q, uint32_t scale_pair, uint32_t (&a)[4]) {
  decode_word<T>(q, a);
#pragma unroll
  for (int j = 0; j < 4; ++j) a[j] = mul2<T>(a[j], scale_pair);
}

// ---- The paired packing -----------------------------------------------------------------------------------------
// After the rotate and mask, element 2j's (mantissa, exponent, sign) sit at bits (6, 7-8, 15) and element 2j + 1's
// at (22, 23-24, 31): the bf16 layout of e2m1 * 2^-126. f16 (e2m1 * 2^-14) wants them at (9, 10-11, 15): 2 more ops.
constexpr uint32_t kPairedMask = 0x81C081C0u;

template <typename T>
__device__ __forceinline__ uint32_t from_bf16_bits(uint32_t p);
template <>
__device__ __forceinline__ uint32_t from_bf16_bits<__nv_bfloat16>(uint32_t p) {
  return p;
}
template <>
__device__ __forceinline__ uint32_t from_bf16_bits<__half>(uint32_t p) {
  return (p & 0x80008000u) | ((p << 3) & 0x0E000E00u);
}

// P[j] = (element 2j, element 2j + 1) of paired word w, unscaled. Pairs 0-2 are rotations of the mask (a rotate
// and an AND); no 4-way tiling of the word by rotations of one mask exists, so pair 3 takes the 8 bits left over.
template <typename T>
__device__ __forceinline__ void decode_paired(uint32_t w, uint32_t (&p)[4]) {
  p[0] = from_bf16_bits<T>((w << 6) & kPairedMask);
  p[1] = from_bf16_bits<T>((w << 2) & kPairedMask);
  p[2] = from_bf16_bits<T>(__funnelshift_l(w, w, 28) & kPairedMask);
  p[3] = from_bf16_bits<T>((w & 0x81808180u) | ((w >> 8) & 0x00400040u));
}

// x elements e0..e7 (X = four 16-bit pairs in element order) regrouped as the mma B operand of
// the decoded pairs: {(e0, e4), (e1, e5)} feed the step using P[0], P[1]; {(e2, e6), (e3, e7)}
// the step using P[2], P[3].
__device__ __forceinline__ void x_pairs(const uint4& xv, uint32_t (&b)[4]) {
  b[0] = __byte_perm(xv.x, xv.z, 0x5410);
  b[1] = __byte_perm(xv.x, xv.z, 0x7632);
  b[2] = __byte_perm(xv.y, xv.w, 0x5410);
  b[3] = __byte_perm(xv.y, xv.w, 0x7632);
}

// The GEMV's operands of one weight word in either packing: A[j] (scaled) and the x pairs B[j] that multiply it
// (ModelOpt: element pairs (j, j + 4), x regrouped to match; paired: (2j, 2j + 1), x as loaded).
template <bool PAIRED, typename T>
__device__ __forceinline__ void decode_scaled_packed(uint32_t q, uint32_t scale_pair, uint32_t (&a)[4]) {
  if constexpr (PAIRED) {
    decode_paired<T>(q, a);
#pragma unroll
    for (int j = 0; j < 4; ++j) a[j] = mul2<T>(a[j], scale_pair);
  } else {
    decode_scaled<T>(q, scale_pair, a);
  }
}

template <bool PAIRED>
__device__ __forceinline__ void x_operand(const uint4& xv, uint32_t (&b)[4]) {
  if constexpr (PAIRED) {
    b[0] = xv.x, b[1] = xv.y, b[2] = xv.z, b[3] = xv.w;
  } else {
    x_pairs(xv, b);
  }
}

// Word q (either packing) decoded and scaled, pairs in element order: V[j] = (element 2j, element 2j + 1) *
// scale * 2^-7. The paired packing yields that order directly; ModelOpt's pairs (j, j + 4) are regrouped.
template <bool PAIRED, typename T>
__device__ __forceinline__ void decode_scaled_in_order(uint32_t q, uint32_t scale_pair, uint32_t (&v)[4]) {
  if constexpr (PAIRED) {
    decode_scaled_packed<true, T>(q, scale_pair, v);
  } else {
    uint32_t p[4];
    decode_scaled<T>(q, scale_pair, p);  // p[j] = (e_j, e_j+4)
    v[0] = __byte_perm(p[0], p[1], 0x5410);  // (e0, e1)
    v[1] = __byte_perm(p[2], p[3], 0x5410);  // (e2, e3)
    v[2] = __byte_perm(p[0], p[1], 0x7632);  // (e4, e5)
    v[3] = __byte_perm(p[2], p[3], 0x7632);  // (e6, e7)
  }
}

}  // namespace blockfp8::fp4
