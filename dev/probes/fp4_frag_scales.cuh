// The fragment packing's scales on the device, shared by the NVFP4 fragment probes (fp4_fragment_probe.cu: the
// wgmma GEMM; fp4_frag_gemv_probe.cu: the decode GEMV). Per (16-row tile, 64-deep stage) the scales of lane group g
// (rows g and g + 8, k16 steps 0-3) sit together, in one of three formats (fp4_probe_data.cuh packs all three):
//   kE4m3  the checkpoint's bytes: 8 bytes, row g's steps 0-3, then row g + 8's;
//   kBf16  the bf16 bits of scale * 2^119: 16 bytes, {row g steps 0, 1}, {row g steps 2, 3}, {row g + 8 steps 0, 1},
//          {row g + 8 steps 2, 3}, low half first (11% more bytes per weight, no conversion);
//   kExp8  one byte per scale, the same 8-byte layout as kE4m3: (bf16 exponent field of scale * 2^119 - 237) << 3 |
//          its 3 mantissa bits. Every nonzero positive e4m3 value lands in fields 237 (2^-9, the smallest subnormal)
//          to 254 (448), so a byte holds it exactly and the bf16 bits are (byte << 4) + 0x7680, two scales per SIMD
//          add. Zero has no byte: the packing zeroes the codes of a zero-scale group instead (their products are
//          zero either way) and negative scales are refused (ModelOpt's are |amax| / 6 / global).
// step_scales turns each into the two bf16 pairs that multiply step kk's decoded fragment (decode.cuh: e2m1 *
// 2^-126 bits times scale * 2^119 = e2m1 * scale * 2^-7), the scale's half picked by the HMUL2's operand selector.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "../../vllm_blockfp8/csrc/common/sm80.cuh"
#include "../../vllm_blockfp8/csrc/fp4/decode.cuh"

namespace probe {

namespace sm80 = blockfp8::sm80;

enum class Scales { kE4m3, kBf16, kExp8 };

template <Scales S>
using ScaleVec = std::conditional_t<S == Scales::kBf16, uint4, uint2>;

// Two e4m3 scales (low byte first) -> each duplicated as a bf16 pair of scale * 2^119: e4m3x2 -> f16x2 (exact) ->
// fp32 x 2^119 (exact) -> one bf16 pair (exact: 4 significant bits), whose halves the HMUL2s take through operand
// selectors (no duplicating PRMT).
__device__ __forceinline__ void scale_pair_halves(uint32_t two, uint32_t& s0, uint32_t& s1) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xffffu), __NV_E4M3);
  const float2 f = __half22float2(sm80::bit_cast<__half2>(uint32_t(h.x) | (uint32_t(h.y) << 16)));
  const float two119 = __uint_as_float(0x7b000000u);
  const __nv_bfloat162 v = __floats2bfloat162_rn(f.x * two119, f.y * two119);
  s0 = sm80::bit_cast<uint32_t>(__low2bfloat162(v));
  s1 = sm80::bit_cast<uint32_t>(__high2bfloat162(v));
}

// Step kk's scales of rows g and g + 8 as duplicated bf16 pairs (scale * 2^119 in each half).
// kExp8: bytes 0 and 2 (even = true) or 1 and 3 of a word -> the bf16 pair of their scales * 2^119.
__device__ __forceinline__ uint32_t exp8_pair(uint32_t w, bool even) {
  return ((even ? w << 4 : w >> 4) & 0x0ff00ff0u) + 0x76807680u;
}

template <Scales S>
__device__ __forceinline__ void step_scales(const ScaleVec<S>& s, int kk, uint32_t& s0, uint32_t& s1) {
  if constexpr (S == Scales::kBf16) {
    const uint32_t g = (kk >> 1) ? s.y : s.x, g8 = (kk >> 1) ? s.w : s.z;
    const __nv_bfloat162 vg = sm80::bit_cast<__nv_bfloat162>(g), vg8 = sm80::bit_cast<__nv_bfloat162>(g8);
    s0 = sm80::bit_cast<uint32_t>((kk & 1) ? __high2bfloat162(vg) : __low2bfloat162(vg));
    s1 = sm80::bit_cast<uint32_t>((kk & 1) ? __high2bfloat162(vg8) : __low2bfloat162(vg8));
  } else if constexpr (S == Scales::kExp8) {  // {step 0, step 2} or {step 1, step 3} of each row
    const __nv_bfloat162 vg = sm80::bit_cast<__nv_bfloat162>(exp8_pair(s.x, (kk & 1) == 0));
    const __nv_bfloat162 vg8 = sm80::bit_cast<__nv_bfloat162>(exp8_pair(s.y, (kk & 1) == 0));
    s0 = sm80::bit_cast<uint32_t>((kk >> 1) ? __high2bfloat162(vg) : __low2bfloat162(vg));
    s1 = sm80::bit_cast<uint32_t>((kk >> 1) ? __high2bfloat162(vg8) : __low2bfloat162(vg8));
  } else {
    scale_pair_halves(__byte_perm(s.x, s.y, uint32_t(kk) | (uint32_t(kk + 4) << 4)), s0, s1);
  }
}

template <Scales S>
__device__ __forceinline__ ScaleVec<S> load_scales(const ScaleVec<S>* base, int64_t index) {
  if constexpr (S == Scales::kBf16) {
    return sm80::load_weight(base + index);
  } else {
    return __ldg(base + index);
  }
}

// Step kk's A fragment (mma.sync m16n8k16, or one warp's share of wgmma m64nNk16): word kk of the lane's 16 bytes
// decoded (its 4 pairs are a[0..3]: rows g, g + 8 x k 2t.., 2t + 8..) and scaled by rows g and g + 8's scales.
template <Scales S>
__device__ __forceinline__ void fragment_step(const uint4& w, const ScaleVec<S>& s, int kk, uint32_t (&f)[4]) {
  uint32_t s0, s1;
  blockfp8::fp4::decode_paired<__nv_bfloat16>(sm80::word(w, kk), f);
  step_scales<S>(s, kk, s0, s1);
  f[0] = blockfp8::fp4::mul2<__nv_bfloat16>(f[0], s0);
  f[1] = blockfp8::fp4::mul2<__nv_bfloat16>(f[1], s1);
  f[2] = blockfp8::fp4::mul2<__nv_bfloat16>(f[2], s0);
  f[3] = blockfp8::fp4::mul2<__nv_bfloat16>(f[3], s1);
}

}  // namespace probe
