// Per-token-group FP8 activation quantizer (tile table at the top), block-FP8 weight dequantizer
// and bias add.
//
// Quantizer math (bit-exact with reference.quantize_per_token_group): for each token row and
// each group of 128 K-values, scale = max(amax, 1e-10) / 448 (fp32), q = e4m3_satfinite_rn(x /
// scale) with IEEE fp32 division (this file must not be built with fast-math).
// Layouts: x [M, K] bf16/fp16 row-major (row stride x_stride, rows 16-byte aligned); q fp8 [M, K]
// contiguous; scales M-major s[g * s_ld + m] (the layout the W8A8 GEMM's TMA reads; s_ld =
// round_up(M, 4)).
// Work split, every row: 16 lanes own one (token, group) pair, 8 values (one 16-byte load) per
// group each; a 256-thread block covers 16 consecutive tokens, so its scale stores for one group
// are one 64-byte run. quant_lane16: one group per block, one block per (token tile, group).
// quant_lane16_g4_persistent: 4 groups per lane, a grid of resident blocks striding over the
// (token tile, 4-group tile) items.
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
#include <climits>

#include "../common/convert.cuh"
#include "../common/vector_rows.h"
#include "quant.h"

namespace blockfp8::quant {
namespace {

using Launcher = cudaError_t (*)(const TokenGroupProblem&, cudaStream_t);

cudaError_t launch_lane16(const TokenGroupProblem& p, cudaStream_t stream);
cudaError_t launch_lane16_g4_persistent(const TokenGroupProblem& p, cudaStream_t stream);

struct QuantRow {
  TileRow info;
  Launcher launch;
};

// Ordered: the first row with max_m >= M that does not reject the problem wins. Every row takes
// every valid problem, so a row after the unbounded one is reached only when forced.
constexpr QuantRow kRows[] = {
    {{"quant_lane16", kUnboundedM,
      "one 16-byte load per lane, a (16 tokens x 1 group) block per grid cell: 63% of copy bandwidth "
      "at M >= 1024 (geomean, 50-70%) and 1.89x vLLM's CUDA quantizer on H200 (quant/NOTES.md)"},
     &launch_lane16},
    {{"quant_lane16_g4_persistent", kUnboundedM,
      "candidate, not measured on the H200 yet; forced only: 4 groups per lane (4 independent 16-byte "
      "loads in flight before the reductions) and a persistent grid of sm_count x resident blocks; "
      "predicted >= 80% of copy bandwidth at M >= 1024"},
     &launch_lane16_g4_persistent},
};
constexpr int kNumRows = int(sizeof(kRows) / sizeof(kRows[0]));
static_assert(kRows[0].info.max_m == kUnboundedM, "row 0 takes every M: later rows stay forced-only");

constexpr int kGroup = 128;
constexpr int kLanesPerGroup = 16;       // 16 lanes x 8 values = one group
constexpr int kTokensPerBlock = 16;      // 16 x 16 = 256 threads
constexpr int kThreads = kLanesPerGroup * kTokensPerBlock;
constexpr int kGroupsPerLane = 4;        // the candidate's loads in flight per lane
constexpr float kFp8Max = 448.0f;
constexpr float kAmaxFloor = 1e-10f;
// quant_lane16 puts 16-token tiles on grid.y (at most 65535), so larger M takes several launches.
constexpr int64_t kMaxTokensPerLaunch = int64_t(65535) * kTokensPerBlock;

template <typename T>
__global__ void __launch_bounds__(kThreads)
per_token_group_kernel(const T* __restrict__ x, uint8_t* __restrict__ q, float* __restrict__ s,
                       int64_t m, int64_t k, int64_t x_stride, int64_t s_ld) {
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
  uint8_t* out = reinterpret_cast<uint8_t*>(&packed);
#pragma unroll
  for (int i = 0; i < 8; ++i)
    out[i] = __nv_cvt_float_to_fp8(v[i] / scale, __NV_SATFINITE, __NV_E4M3);
  *reinterpret_cast<uint2*>(q + row * k + group * kGroup + lane * 8) = packed;
  if (lane == 0) s[group * s_ld + row] = scale;
}

// max |x| over the 8 values of one 16-byte load, compared in packed 16-bit (exact: |x| and max
// are exact there, and widening is monotone), so the fp32 copies of the values are not kept
// alive until the division. max.{bf16,f16}x2 skips a NaN like fmaxf does, and the final fmaxf
// with 0 turns an all-NaN lane into 0, as per_token_group_kernel's fmaxf chain from 0 does.
template <typename T>
__device__ __forceinline__ float abs_max8(const uint4& raw);
template <>
__device__ __forceinline__ float abs_max8<__nv_bfloat16>(const uint4& raw) {
  const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&raw);
  const __nv_bfloat162 m = __hmax2(__hmax2(__habs2(p[0]), __habs2(p[1])), __hmax2(__habs2(p[2]), __habs2(p[3])));
  return fmaxf(fmaxf(0.0f, __low2float(m)), __high2float(m));
}
template <>
__device__ __forceinline__ float abs_max8<__half>(const uint4& raw) {
  const __half2* p = reinterpret_cast<const __half2*>(&raw);
  const __half2 m = __hmax2(__hmax2(__habs2(p[0]), __habs2(p[1])), __hmax2(__habs2(p[2]), __habs2(p[3])));
  return fmaxf(fmaxf(0.0f, __low2float(m)), __high2float(m));
}

// The candidate: a block's work item is 16 tokens x kGroupsPerLane groups; the grid is sized to
// the resident blocks and strides over items (token tile major, so neighbouring blocks read
// neighbouring bytes of the same rows). Each lane issues its kGroupsPerLane 16-byte loads before
// any reduction, and keeps them packed (16 registers) rather than widened: 40 registers, 6
// resident blocks per SM on SM90 (62 and 4 when widened). Per group the arithmetic is the one of
// per_token_group_kernel (the same amax value, scale expression and IEEE division; the x2 cvt
// rounds as the scalar one), so the two rows produce the same bits.
template <typename T>
__global__ void __launch_bounds__(kThreads)
per_token_group_g4_kernel(const T* __restrict__ x, uint8_t* __restrict__ q, float* __restrict__ s,
                          int64_t m, int64_t k, int64_t x_stride, int64_t s_ld) {
  constexpr int G = kGroupsPerLane;
  const int lane = threadIdx.x % kLanesPerGroup;
  const int token = threadIdx.x / kLanesPerGroup;
  const int64_t groups = k / kGroup;
  const int64_t group_tiles = (groups + G - 1) / G;
  const int64_t items = (m + kTokensPerBlock - 1) / kTokensPerBlock * group_tiles;
  // The item loop is block-uniform, so every lane reaches every shuffle below.
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t token_tile = item / group_tiles;
    const int64_t g0 = (item - token_tile * group_tiles) * G;
    const int64_t row = token_tile * kTokensPerBlock + token;
    const bool active = row < m;
    uint4 raw[G];
#pragma unroll
    for (int j = 0; j < G; ++j) {
      raw[j] = make_uint4(0u, 0u, 0u, 0u);
      if (active && g0 + j < groups)
        raw[j] = *reinterpret_cast<const uint4*>(x + row * x_stride + (g0 + j) * kGroup + lane * 8);
    }
    float amax[G];
#pragma unroll
    for (int j = 0; j < G; ++j) amax[j] = abs_max8<T>(raw[j]);
    // Interleaved so the G shuffle chains overlap instead of serializing their latencies.
#pragma unroll
    for (int offset = kLanesPerGroup / 2; offset > 0; offset /= 2) {
#pragma unroll
      for (int j = 0; j < G; ++j)
        amax[j] = fmaxf(amax[j], __shfl_xor_sync(0xffffffffu, amax[j], offset, kLanesPerGroup));
    }
    if (active) {
#pragma unroll
      for (int j = 0; j < G; ++j) {
        if (g0 + j >= groups) break;
        const float scale = fmaxf(amax[j], kAmaxFloor) / kFp8Max;
        const T* h = reinterpret_cast<const T*>(&raw[j]);
        uint32_t pair[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
          pair[i] = __nv_cvt_float2_to_fp8x2(
              make_float2(to_float(h[2 * i]) / scale, to_float(h[2 * i + 1]) / scale), __NV_SATFINITE, __NV_E4M3);
        *reinterpret_cast<uint2*>(q + row * k + (g0 + j) * kGroup + lane * 8) =
            make_uint2(pair[0] | (pair[1] << 16), pair[2] | (pair[3] << 16));
        if (lane == 0) s[(g0 + j) * s_ld + row] = scale;
      }
    }
  }
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

template <typename T>
cudaError_t launch_lane16_typed(const TokenGroupProblem& p, cudaStream_t stream) {
  const T* x = static_cast<const T*>(p.x);
  for (int64_t m0 = 0; m0 < p.m; m0 += kMaxTokensPerLaunch) {
    const int64_t rows = std::min(kMaxTokensPerLaunch, p.m - m0);
    const dim3 grid(static_cast<unsigned>(p.k / kGroup),
                    static_cast<unsigned>((rows + kTokensPerBlock - 1) / kTokensPerBlock));
    per_token_group_kernel<T><<<grid, kThreads, 0, stream>>>(x + m0 * p.x_stride, p.q + m0 * p.k, p.s + m0, rows,
                                                             p.k, p.x_stride, p.s_ld);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

cudaError_t launch_lane16(const TokenGroupProblem& p, cudaStream_t stream) {
  return p.bf16 ? launch_lane16_typed<__nv_bfloat16>(p, stream) : launch_lane16_typed<__half>(p, stream);
}

// Resident blocks per SM of the candidate, asked of the occupancy calculator once per process
// (ptxas picks the register count, so a constant here could drift from it). A wrong value only
// costs speed: the kernel strides over its items whatever the grid.
template <typename T>
int resident_blocks_per_sm() {
  static const int blocks = [] {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, per_token_group_g4_kernel<T>, kThreads, 0) != cudaSuccess) {
      (void)cudaGetLastError();  // keep the failed query from surfacing as this launch's error
      n = 0;
    }
    return n > 0 ? n : 1;
  }();
  return blocks;
}

template <typename T>
cudaError_t launch_g4_typed(const TokenGroupProblem& p, cudaStream_t stream) {
  const int64_t group_tiles = (p.k / kGroup + kGroupsPerLane - 1) / kGroupsPerLane;
  const int64_t items = (p.m + kTokensPerBlock - 1) / kTokensPerBlock * group_tiles;
  // Without an SM count (a shape-only caller) fall back to one block per item.
  const int64_t resident = p.sm_count > 0 ? int64_t(p.sm_count) * resident_blocks_per_sm<T>() : items;
  const int64_t blocks = std::min<int64_t>(std::min(items, resident), INT_MAX);
  per_token_group_g4_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      static_cast<const T*>(p.x), p.q, p.s, p.m, p.k, p.x_stride, p.s_ld);
  return cudaGetLastError();
}

cudaError_t launch_lane16_g4_persistent(const TokenGroupProblem& p, cudaStream_t stream) {
  return p.bf16 ? launch_g4_typed<__nv_bfloat16>(p, stream) : launch_g4_typed<__half>(p, stream);
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
  for (int i = 0; i < kNumRows; ++i)
    if (kRows[i].info.max_m >= p.m && rejects(i, p) == nullptr) return i;
  return -1;
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
