// Device primitives shared by the mma.sync kernels (FP8 GEMV, FP4 GEMV, W4A16 GEMM, the SM89 W8A8 GEMM): SM80+
// instructions only (mma.sync m16n8k16, ld.global.nc with an L1 hint, cp.async, ldmatrix), so they compile for
// every arch the extension builds (8.9, 9.0a, 12.0a).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

namespace blockfp8::sm80 {

template <typename To, typename From>
__device__ __forceinline__ To bit_cast(const From& v) {
  static_assert(sizeof(To) == sizeof(From), "bit_cast between types of different sizes");
  To out;
  memcpy(&out, &v, sizeof(To));
  return out;
}

__device__ __forceinline__ uint32_t word(const uint4& v, int q) {
  return q == 0 ? v.x : q == 1 ? v.y : q == 2 ? v.z : v.w;
}

// Weights are read exactly once: keep them out of L1 so x (re-read by every warp) stays there.
__device__ __forceinline__ uint4 load_weight(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

template <typename T>
__device__ __forceinline__ uint4 load_x8(const T* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}

// The same 8 elements for an x that is only 2-byte aligned (the unbounded rows' fallback).
template <typename T>
__device__ __forceinline__ uint4 load_x8_unaligned(const T* p) {
  const unsigned short* h = reinterpret_cast<const unsigned short*>(p);
  uint4 v;
  v.x = uint32_t(__ldg(h + 0)) | (uint32_t(__ldg(h + 1)) << 16);
  v.y = uint32_t(__ldg(h + 2)) | (uint32_t(__ldg(h + 3)) << 16);
  v.z = uint32_t(__ldg(h + 4)) | (uint32_t(__ldg(h + 5)) << 16);
  v.w = uint32_t(__ldg(h + 6)) | (uint32_t(__ldg(h + 7)) << 16);
  return v;
}

__device__ __forceinline__ float2 f16x2_to_float2(uint32_t v) { return __half22float2(bit_cast<__half2>(v)); }

__device__ __forceinline__ float2 bf16x2_to_float2(uint32_t v) {
  return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}

template <typename T>
__device__ __forceinline__ float2 x2_to_float2(uint32_t v);
template <>
__device__ __forceinline__ float2 x2_to_float2<__half>(uint32_t v) { return f16x2_to_float2(v); }
template <>
__device__ __forceinline__ float2 x2_to_float2<__nv_bfloat16>(uint32_t v) { return bf16x2_to_float2(v); }

// cp.async global -> shared (the shared side as a generic pointer or a shared-window address). 16 bytes go L2
// only (.cg: streamed tiles); 8 and 4 bytes through L1 (.ca: the only sizes .cg lacks).
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(smem)), "l"(gmem));
}
// src_bytes = 0 zero-fills the 16 bytes (rows past a ragged edge) without reading src.
__device__ __forceinline__ void cp_async16_zfill(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes));
}
// 16 bytes that stay in L1 too (.ca): data that other blocks on the SM read soon after (a GEMV's x).
__device__ __forceinline__ void cp_async16_l1(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void st_shared_zero16(uint32_t dst) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(dst), "r"(0));
}
__device__ __forceinline__ void cp_async8(void* smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(smem_addr(smem)), "l"(gmem));
}
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_addr(smem)), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

// Four 8x8 b16 matrices from shared memory (lanes 8i..8i+7 give matrix i's row addresses).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) { ldmatrix_x4(r, smem_addr(p)); }

// d += A (16x16) * B (16x8), fp32 accumulate; A row-major, B column-major (K contiguous per column).
template <typename T>
__device__ __forceinline__ void mma16816(float& d0, float& d1, float& d2, float& d3, uint32_t a0, uint32_t a1,
                                         uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma16816<__half>(float& d0, float& d1, float& d2, float& d3, uint32_t a0, uint32_t a1,
                                                 uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float& d0, float& d1, float& d2, float& d3, uint32_t a0,
                                                        uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                                        uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

}  // namespace blockfp8::sm80
