// Per-token-group FP8 activation quantizer (tile table at the top), block-FP8 weight dequantizer
// and bias add.
//
// Quantizer math (bit-exact with reference.quantize_per_token_group): for each token row and
// each group of 128 K-values, scale = max(amax, 1e-10) / 448 (fp32), q = e4m3_satfinite_rn(x /
// scale) correctly rounded as by IEEE fp32 division (this file must not be built with fast-math).
// Layouts: x [M, K] bf16/fp16 row-major (row stride x_stride, rows 16-byte aligned); q fp8 [M, K]
// contiguous; scales M-major s[g * s_ld + m] (the layout the W8A8 GEMM's TMA reads; s_ld =
// round_up(M, 4)).
// Work split, every row: 16 lanes own one (token, group) pair, 8 values (one 16-byte load) per
// group each; a 256-thread block covers 16 consecutive tokens, so its scale stores for one group
// are one 64-byte run; one group per block, one block per (token tile, group). The quotient
// RN(x / scale) is x * RN(1 / scale) plus one FMA correction step, the IEEE division only where
// |x / scale| < 2^-6 (zeros included): bit-identical, and 4-14% faster than dividing (NOTES.md).
// Arch: any SM80+ (plain loads; cvt to e4m3 is one instruction from SM89 on, the intrinsics fall
// back to software on older archs). Unsupported: K % 128 != 0 (the wrapper rejects it).
//
// Bias add: out += bias per column, for the linear paths that have no fused epilogue.
// Dequantizer: w[n, k] = e4m3(b[n, k]) * b_scale[n/128, k/128] in 16-bit, 16 values per thread;
// used by the fallback linear row (dequantize + cuBLAS) where no W8A8 kernel exists for the arch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "../common/convert.cuh"
#include "../common/vector_rows.h"
#include "quant.h"

namespace blockfp8::quant {
namespace {

using Launcher = cudaError_t (*)(const TokenGroupProblem&, cudaStream_t);

cudaError_t launch_lane16(const TokenGroupProblem& p, cudaStream_t stream);

struct QuantRow {
  TileRow info;
  Launcher launch;
};

// Ordered: the first row with max_m >= M that does not reject the problem wins. One row: it takes
// every valid problem (the dividing quant_lane16 it replaced was slower at every measured point).
constexpr QuantRow kRows[] = {
    {{"quant_lane16_rcp", kUnboundedM,
      "one 16-byte load per lane, a (16 tokens x 1 group) block per grid cell, quotient by corrected "
      "reciprocal: 71% of copy bandwidth at M >= 1024 (geomean) vs 62% dividing, 2.13x vLLM's CUDA "
      "quantizer on H200 (quant/NOTES.md, 2026-11-30 x2 run)"},
     &launch_lane16},
};
constexpr int kNumRows = int(sizeof(kRows) / sizeof(kRows[0]));
static_assert(kRows[0].info.max_m == kUnboundedM, "row 0 takes every M: later rows stay forced-only");

constexpr int kGroup = 128;
constexpr int kLanesPerGroup = 16;       // 16 lanes x 8 values = one group
constexpr int kTokensPerBlock = 16;      // 16 x 16 = 256 threads
constexpr int kThreads = kLanesPerGroup * kTokensPerBlock;
constexpr float kFp8Max = 448.0f;
constexpr float kAmaxFloor = 1e-10f;
// 16-token tiles go on grid.y (at most 65535), so larger M takes several launches.
constexpr int64_t kMaxTokensPerLaunch = int64_t(65535) * kTokensPerBlock;
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

template <typename T>
__global__ void __launch_bounds__(kThreads)
per_token_group_kernel(const T* __restrict__ x, uint8_t* __restrict__ q, float* __restrict__ s,
                       int64_t m, int64_t k, int64_t x_stride, int64_t s_ld, bool trigger_dependents) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // A GEMM launched after this one with programmatic dependent launch (gemm/sm90/kernels/cutlass_gemm.cuh) may start
  // setting up now; it waits for this grid to end before it reads q and s.
  if (trigger_dependents) asm volatile("griddepcontrol.launch_dependents;");
#endif
  const int lane = threadIdx.x % kLanesPerGroup;
  const int64_t row = int64_t(blockIdx.y) * kTokensPerBlock + threadIdx.x / kLanesPerGroup;
  const int64_t group = blockIdx.x;
  // Rows past M still take part in the shuffles (all 16 lanes of a row share the predicate).
  const bool active = row < m;

  float v[8];
  if (active) {
    const uint4 raw = *reinterpret_cast<const uint4*>(x + row * x_stride + group * kGroup + lane * 8);
    const T* h = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = to_float(h[i]);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = 0.0f;
  }
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
  for (int offset = kLanesPerGroup / 2; offset > 0; offset /= 2)
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset, kLanesPerGroup));
  if (!active) return;

  const float scale = fmaxf(amax, kAmaxFloor) / kFp8Max;
  uint2 packed;
  const float r = __frcp_rn(scale);  // one correctly rounded reciprocal per lane and group
  __nv_fp8x2_storage_t* out = reinterpret_cast<__nv_fp8x2_storage_t*>(&packed);
#pragma unroll
  for (int i = 0; i < 8; i += 2)  // .x goes to the low byte
    out[i / 2] = __nv_cvt_float2_to_fp8x2(corrected_quotient(v[i], v[i + 1], scale, r), __NV_SATFINITE, __NV_E4M3);
  *reinterpret_cast<uint2*>(q + row * k + group * kGroup + lane * 8) = packed;
  if (lane == 0) s[group * s_ld + row] = scale;
}

template <typename T>
__global__ void __launch_bounds__(256)
dequant_weight_kernel(const uint8_t* __restrict__ b, const float* __restrict__ b_scale, T* __restrict__ w,
                      int64_t n, int64_t k) {
  const int64_t chunks_per_row = k / 16;
  const int64_t scale_cols = (k + kGroup - 1) / kGroup;
  const int64_t total = n * chunks_per_row;
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < total;
       c += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = c / chunks_per_row;
    const int64_t col = (c - row * chunks_per_row) * 16;
    // 16 consecutive values never straddle a 128-wide block (col is a multiple of 16).
    const float scale = b_scale[(row / kGroup) * scale_cols + col / kGroup];
    const uint4 raw = *reinterpret_cast<const uint4*>(b + row * k + col);
    const __nv_fp8_storage_t* f8 = reinterpret_cast<const __nv_fp8_storage_t*>(&raw);
    alignas(16) T vals[16];
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
      const __half2_raw pair = __nv_cvt_fp8x2_to_halfraw2(
          static_cast<__nv_fp8x2_storage_t>(f8[i] | (uint16_t(f8[i + 1]) << 8)), __NV_E4M3);
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&pair));
      vals[i] = from_float<T>(f.x * scale);
      vals[i + 1] = from_float<T>(f.y * scale);
    }
    uint4* dst = reinterpret_cast<uint4*>(w + row * k + col);
    dst[0] = reinterpret_cast<const uint4*>(vals)[0];
    dst[1] = reinterpret_cast<const uint4*>(vals)[1];
  }
}

template <typename T>
__global__ void __launch_bounds__(256)
add_bias_kernel(T* __restrict__ out, const T* __restrict__ bias, int64_t m, int64_t n) {
  const int64_t total = m * n;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_float<T>(to_float(out[i]) + to_float(bias[i % n]));
}

// One (16 tokens x 1 group) block per grid cell, M split over launches.
template <typename T>
cudaError_t launch_lane16_typed(const TokenGroupProblem& p, cudaStream_t stream) {
  const T* x = static_cast<const T*>(p.x);
  for (int64_t m0 = 0; m0 < p.m; m0 += kMaxTokensPerLaunch) {
    const int64_t rows = std::min(kMaxTokensPerLaunch, p.m - m0);
    const dim3 grid(static_cast<unsigned>(p.k / kGroup),
                    static_cast<unsigned>((rows + kTokensPerBlock - 1) / kTokensPerBlock));
    per_token_group_kernel<T><<<grid, kThreads, 0, stream>>>(
        x + m0 * p.x_stride, p.q + m0 * p.k, p.s + m0, rows, p.k, p.x_stride, p.s_ld, p.trigger_dependents);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

cudaError_t launch_lane16(const TokenGroupProblem& p, cudaStream_t stream) {
  return p.bf16 ? launch_lane16_typed<__nv_bfloat16>(p, stream) : launch_lane16_typed<__half>(p, stream);
}

}  // namespace

int num_rows() { return kNumRows; }

const TileRow& row(int i) { return kRows[i].info; }

const char* rejects(int i, const TokenGroupProblem& p) {
  if (i < 0 || i >= kNumRows) return "row out of range";
  if (p.m < 0 || p.k < 0) return "M and K must be >= 0";
  if (p.k % kGroup != 0) return "K must be a multiple of 128 (one scale per 128 values)";
  if (p.s_ld < p.m) return "s_ld must be >= M";
  if (p.m == 0 || p.k == 0) return nullptr;  // nothing is read or written
  if (!rows_16byte_aligned(p.x, p.m, p.x_stride)) return kRowsNot16ByteAligned;
  if (reinterpret_cast<uintptr_t>(p.q) % 8 != 0) return "q must be 8-byte aligned";
  return nullptr;
}

int select(const TokenGroupProblem& p) {
  return first_row_taking(kRows, kNumRows, p.m, [&](int i) { return rejects(i, p); });
}

cudaError_t launch(int i, const TokenGroupProblem& p, cudaStream_t stream) {
  if (rejects(i, p) != nullptr) return cudaErrorInvalidValue;
  if (p.m == 0 || p.k == 0) return cudaSuccess;
  return kRows[i].launch(p, stream);
}

cudaError_t launch_add_bias(const BiasProblem& p, cudaStream_t stream) {
  const int64_t total = p.m * p.n;
  if (total == 0) return cudaSuccess;
  const int64_t blocks = (total + 255) / 256;
  const dim3 grid(static_cast<unsigned>(blocks < 65536 ? blocks : 65536));
  if (p.bf16) {
    add_bias_kernel<__nv_bfloat16><<<grid, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(p.out),
                                                             static_cast<const __nv_bfloat16*>(p.bias), p.m, p.n);
  } else {
    add_bias_kernel<__half><<<grid, 256, 0, stream>>>(static_cast<__half*>(p.out), static_cast<const __half*>(p.bias),
                                                      p.m, p.n);
  }
  return cudaGetLastError();
}

cudaError_t launch_dequant_weight(const DequantProblem& p, cudaStream_t stream) {
  const int64_t chunks = p.n * (p.k / 16);
  if (chunks == 0) return cudaSuccess;
  const int64_t blocks = (chunks + 255) / 256;
  const dim3 grid(static_cast<unsigned>(blocks < 65536 ? blocks : 65536));
  if (p.bf16) {
    dequant_weight_kernel<__nv_bfloat16><<<grid, 256, 0, stream>>>(
        p.b, p.b_scale, static_cast<__nv_bfloat16*>(p.w), p.n, p.k);
  } else {
    dequant_weight_kernel<__half><<<grid, 256, 0, stream>>>(p.b, p.b_scale, static_cast<__half*>(p.w),
                                                            p.n, p.k);
  }
  return cudaGetLastError();
}

}  // namespace blockfp8::quant
