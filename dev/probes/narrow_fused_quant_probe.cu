// The activation quantizer fused into the SM90 tok64 GEMM through register-A wgmma, on narrow long-K layers (an
// H100/H200 diagnostic; not part of the extension).
//
// Question (gemm/NOTES.md, open leads): on layers with N <= ~1.5k and K >= 4k the full linear loses to cuBLAS bf16
// because x is the big operand and the separate quantizer pass reads it, writes it as fp8 and the GEMM reads it again
// (kv_a 576x7168 at M = 4096: ~33 of ~78 us). Can the GEMM quantize x itself, with the conversion hidden under its
// wgmma, and what does the layer then take against the two launches and against cuBLAS bf16?
//
//   out[m, n] = sum_kb (q[m, kb] . w[n, kb]) * sx[m, kb] * w_scale[n / 128, kb],
//   sx[m, kb] = max(amax(x[m, kb-block]), 1e-10) / 448, q = e4m3_satfinite_rn(x / sx)      (the quantizer's bits)
//
// The fused kernel is tok64's (vllm_blockfp8/csrc/gemm/sm90/kernels/tok64.cu: 64 tokens x TileN weight rows, one
// math warpgroup, one producer warp, a TMA ring) with x loaded as bf16 (two 128-byte-swizzled 64-column boxes a stage)
// instead of fp8 + token scales. The math warpgroup reads x from shared memory in the m64k32 8-bit A fragment layout
// (lane (g, t) of warp w: rows 16w + g and + 8, columns 4t..4t+3 and 16 + 4t..: the rows its accumulators hold, so a
// token's 128 values of a K block lie in one lane quad: amax is a local max and two shfl.xor), quantizes with the
// quantizer's own corrected_quotient, and issues 4 register-A e4m3 wgmma. Block k + 1 is converted while block k's
// wgmma run (two A register sets); the promotion is tok64's (acc += partial * (token scale * weight scale)), so with
// the same fp8 operands the output should equal the unfused path's bits.
//
// Compared in one run per shape and M, CUDA graphs over copies of x (together larger than L2): the fused kernel, the
// extension's quantizer + tok64 kernel at the same width (its two launches, no PDL: K > 4096), and cuBLAS bf16 on the
// dequantized weight. Checked first: fused == unfused bit for bit (the count of differing outputs is printed) and
// both against an fp64 reference of the quantized operands (max relative error over the output's max).
// Unsupported here: M % 64 != 0, N % TileN != 0, K % 128 != 0 (the probe's shapes satisfy them).
// Result (an H100, benchmarks/results/narrow_fused_quant_probe.json): bits equal to the two launches everywhere, but
// 6.1-11.2x their time: ~2.7 us a K block at every width and wave count, the conversion issued by one warp per
// scheduler and repeated for every N tile; the PROBE_CONVERT variants (below) put 3.5x of it on the exact quotient's
// guard and show the bare structure at 1.2-2.4x the two launches (gemm/NOTES.md, open leads). 219 / 255 / 252
// registers at TileN = 64 / 96 / 128, 0 spills, no serialized wgmma.
//
// Build and run (the stage `narrow_fused_quant_probe` of dev/device/h200_check.sh does this):
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -I <nvidia-cutlass include> \
//        -I vllm_blockfp8/csrc dev/probes/narrow_fused_quant_probe.cu -lcublas -o probe && ./probe out.json
#include <cublas_v2.h>

#include <cmath>
#include <cstring>
#include <random>

#include "../../vllm_blockfp8/csrc/gemm/sm90/kernels/tok64.cu"
#include "../../vllm_blockfp8/csrc/quant/quant.cu"
#include "probe_util.cuh"

// PROBE_CONVERT (timing variants; 0 and 4 keep the quantizer's bits): 0 the quantizer's exact quotient, 1 x * RN(1 /
// scale), 2 that without the amax (a fixed scale), 3 no conversion at all (bf16 bytes passed as e4m3): what the
// structure (TMA of bf16 x, register-A wgmma, promotion) costs alone; 4 the exact quotient without its division branch.
#ifndef PROBE_CONVERT
#define PROBE_CONVERT 0
#endif

namespace fused_probe {

// The quantizer's quotient RN(x / scale) without the division branch of corrected_quotient: Q for every value, then p
// itself where |p| < 2^-11 (there every quotient converts to e4m3 +-0, and p has x's sign: zeros, fp32-subnormal x).
// tests/test_quant_fast_quotient.py proves the e4m3 bytes equal the reference's (every 16-bit significand pair down to
// below 2^-11, edges, midpoints).
__device__ __forceinline__ float2 exact_quotient_branchless(float x0, float x1, float scale, float r) {
  const float p0 = __fmul_rn(x0, r), p1 = __fmul_rn(x1, r);
  const float q0 = __fmaf_rn(__fmaf_rn(-p0, scale, x0), r, p0), q1 = __fmaf_rn(__fmaf_rn(-p1, scale, x1), r, p1);
  return make_float2(fabsf(p0) < 0x1p-11f ? p0 : q0, fabsf(p1) < 0x1p-11f ? p1 : q1);
}

using namespace cute;
namespace tok64 = blockfp8::gemm::sm90::tok64;
using tok64::Barrier;
using Fp8 = cutlass::float_e4m3_t;
using bf16 = __nv_bfloat16;

constexpr int kTok = 64, kTileK = 128, kThreads = 160;
constexpr int kXBytes = kTok * kTileK * 2;  // bf16: two 64-column boxes of 8 KiB

template <int TileN>
struct Tile {
  static constexpr int kBBytes = TileN * kTileK;
  static constexpr int kStageBytes = kXBytes + kBBytes;
  static constexpr int kStages = std::min(12, (227 * 1024 - 1024 - 16 * 12) / kStageBytes);
  static constexpr int kSmem = 1024 + kStages * kStageBytes + 16 * kStages;
  static constexpr int kGroups = TileN / 8;
  static_assert(kGroups % 4 == 0, "the epilogue's quad transpose takes 4 8-column groups at a time");
  using Mma = decltype(make_tiled_mma(SM90::GMMA::rs_op_selector<Fp8, Fp8, float, Shape<_64, Int<TileN>, _32>>()));
};

// One K block's 4 wgmma (k32 steps) of operands a(_, _, kk) and b(_, _, kk) into a fresh fragment.
template <class Mma, class A, class B, class D>
__device__ __forceinline__ void wgmma_block(Mma& mma, const A& a, const B& b, D& partial) {
  warpgroup_fence_operand(partial);
  warpgroup_arrive();
  mma.accumulate_ = GMMA::ScaleOut::Zero;
  CUTLASS_PRAGMA_UNROLL
  for (int kk = 0; kk < kTileK / 32; ++kk) {
    cute::gemm(mma, a(_, _, kk), b(_, _, kk), partial);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
}

// tok64's promotion: acc += partial * fl(token scale x weight scale), rows g (t0) and g + 8 (t1), 8-column groups
// from `upper_group` on in the weight scale block above (w_hi).
template <int Groups, class D>
__device__ __forceinline__ void promote(D& acc, const D& partial, int upper_group, float t0, float t1, float w_lo,
                                        float w_hi) {
  const float s0_lo = t0 * w_lo, s1_lo = t1 * w_lo, s0_hi = t0 * w_hi, s1_hi = t1 * w_hi;
  CUTLASS_PRAGMA_UNROLL
  for (int gi = 0; gi < Groups; ++gi) {
    const bool upper = gi >= upper_group;
    const float scale0 = upper ? s0_hi : s0_lo, scale1 = upper ? s1_hi : s1_lo;
    acc(4 * gi + 0) = fmaf(partial(4 * gi + 0), scale0, acc(4 * gi + 0));
    acc(4 * gi + 1) = fmaf(partial(4 * gi + 1), scale0, acc(4 * gi + 1));
    acc(4 * gi + 2) = fmaf(partial(4 * gi + 2), scale1, acc(4 * gi + 2));
    acc(4 * gi + 3) = fmaf(partial(4 * gi + 3), scale1, acc(4 * gi + 3));
  }
}

struct Params {
  const float* w_scale;  // [ceil(n / 128), k / 128]
  bf16* out;
  int m, n, k_blocks, m_tiles;
};

// The tile's weight scale rows: the 128-row block its first column lies in and the one above (the last block where
// none is), and the first 8-column group in the block above.
struct WeightScales {
  const float *lo, *hi;
  int upper_group;
  __device__ WeightScales(const Params& p, int n0) {
    const int block = n0 / 128, last = (p.n + 127) / 128 - 1;
    lo = p.w_scale + int64_t(block) * p.k_blocks, hi = p.w_scale + int64_t(min(block + 1, last)) * p.k_blocks;
    upper_group = ((block + 1) * 128 - n0) / 8;
  }
};


template <int TileN>
__global__ void __launch_bounds__(kThreads, 1)
    fused_gemm(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap w_map, const Params p) {
  using T = Tile<TileN>;
  constexpr int S = T::kStages;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (cute::cast_smem_ptr_to_uint(smem_raw) & 1023)) & 1023);
  uint8_t* smem_x = smem;                     // S x 16 KiB bf16
  uint8_t* smem_w = smem_x + S * kXBytes;     // S x TileN x 128 fp8
  uint64_t* full = reinterpret_cast<uint64_t*>(smem_w + S * T::kBBytes);
  uint64_t* empty = full + S;
  const int n0 = int(blockIdx.x) / p.m_tiles * TileN, m0 = int(blockIdx.x) % p.m_tiles * kTok;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) Barrier::init(&full[s], 1), Barrier::init(&empty[s], 4);
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  if (warp == 4) {
    if (lane != 0) return;
    for (int kb = 0, s = 0, phase = 0; kb < p.k_blocks; ++kb) {
      if (kb >= S) Barrier::wait(&empty[s], phase ^ 1);
      Barrier::arrive_and_expect_tx(&full[s], kXBytes + T::kBBytes);
      const uint32_t xs = cute::cast_smem_ptr_to_uint(smem_x + s * kXBytes);
      tok64::tma_load_2d(xs, &x_map, kb * kTileK, m0, &full[s]);
      tok64::tma_load_2d(xs + kXBytes / 2, &x_map, kb * kTileK + 64, m0, &full[s]);
      tok64::tma_load_2d(cute::cast_smem_ptr_to_uint(smem_w + s * T::kBBytes), &w_map, kb * kTileK, n0, &full[s]);
      if (++s == S) s = 0, phase ^= 1;
    }
    return;
  }

  auto w_layout = tile_to_shape(GMMA::Layout_K_SW128_Atom<Fp8>{}, Shape<Int<TileN>, Int<kTileK>, Int<S>>{});
  Tensor sW = make_tensor(make_smem_ptr(reinterpret_cast<Fp8*>(smem_w)), w_layout);
  // A shared-memory layout of one fp8 x tile only gives the register fragment its shape (MMA, 1, 4).
  auto a_layout = tile_to_shape(GMMA::Layout_K_SW128_Atom<Fp8>{}, Shape<_64, Int<kTileK>>{});
  Tensor sA = make_tensor(make_smem_ptr(reinterpret_cast<Fp8*>(smem_x)), a_layout);
  typename T::Mma mma;
  auto thr = mma.get_thread_slice(threadIdx.x);
  Tensor a0 = thr.partition_fragment_A(sA);
  Tensor a1 = thr.partition_fragment_A(sA);
  Tensor tCrW = thr.make_fragment_B(thr.partition_B(sW));
  Tensor acc = partition_fragment_C(mma, Shape<_64, Int<TileN>>{});
  Tensor partial = make_fragment_like(acc);
  clear(acc);

  const int g = lane / 4, t = lane % 4, row = warp * 16 + g;
  const WeightScales ws(p, n0);
  const float *w_scale_lo = ws.lo, *w_scale_hi = ws.hi;
  const int upper_group = ws.upper_group;

  // Stage s's x block into `a` (16 e4m3 per k32 slice: register j = 4 kk + 2 h + r holds row g + 8 r, columns
  // 32 kk + 16 h + 4t..+3, the low byte first) and this lane's two token scales.
  const auto convert = [&](auto& a, const int s, float& scale0, float& scale1) __attribute__((always_inline)) {
    const uint32_t xs = cute::cast_smem_ptr_to_uint(smem_x + s * kXBytes);
    uint32_t raw[2][8][2];  // [row][kk * 2 + h][word]: bf16 pairs
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < 2; ++r) {
      const int x_row = row + 8 * r;
      CUTLASS_PRAGMA_UNROLL
      for (int c8 = 0; c8 < 8; ++c8) {
        const int col = 16 * c8 + 4 * t, box = col >> 6, chunk = (col & 63) >> 3;
        const uint32_t at = xs + box * (kXBytes / 2) + x_row * 128 + ((chunk ^ (x_row & 7)) << 4) + (col & 7) * 2;
        asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(raw[r][c8][0]), "=r"(raw[r][c8][1]) : "r"(at));
      }
    }
    float scale[2];
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < 2; ++r) {
      float amax = 0.f;
      CUTLASS_PRAGMA_UNROLL
      for (int c8 = 0; c8 < 8; ++c8)
        CUTLASS_PRAGMA_UNROLL
        for (int w = 0; w < 2; ++w)
          amax = fmaxf(amax, fmaxf(fabsf(__uint_as_float(raw[r][c8][w] << 16)),
                                   fabsf(__uint_as_float(raw[r][c8][w] & 0xffff0000u))));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
      scale[r] = fmaxf(amax, blockfp8::quant::kAmaxFloor) / blockfp8::quant::kFp8Max;
#if PROBE_CONVERT == 2 || PROBE_CONVERT == 3
      scale[r] = 1.f / 64.f;  // timing only: no amax (the compiler drops its loads' uses above)
#endif
      const float rcp = __frcp_rn(scale[r]);
      CUTLASS_PRAGMA_UNROLL
      for (int c8 = 0; c8 < 8; ++c8) {
        uint32_t packed = 0;
        CUTLASS_PRAGMA_UNROLL
        for (int w = 0; w < 2; ++w) {
#if PROBE_CONVERT == 3
          packed |= (raw[r][c8][w] >> 8 & 0xffu | raw[r][c8][w] >> 16 & 0xff00u) << (16 * w);  // no conversion
#else
#if PROBE_CONVERT == 1 || PROBE_CONVERT == 2
          const float2 q = make_float2(__fmul_rn(__uint_as_float(raw[r][c8][w] << 16), rcp),
                                       __fmul_rn(__uint_as_float(raw[r][c8][w] & 0xffff0000u), rcp));
#elif PROBE_CONVERT == 4
          const float2 q = exact_quotient_branchless(__uint_as_float(raw[r][c8][w] << 16),
                                                     __uint_as_float(raw[r][c8][w] & 0xffff0000u), scale[r], rcp);
#else
          const float2 q = blockfp8::quant::corrected_quotient(__uint_as_float(raw[r][c8][w] << 16),
                                                               __uint_as_float(raw[r][c8][w] & 0xffff0000u),
                                                               scale[r], rcp);
#endif
          packed |= uint32_t(__nv_cvt_float2_to_fp8x2(q, __NV_SATFINITE, __NV_E4M3)) << (16 * w);
#endif
        }
        // c8 = 2 kk + h: register 4 kk + 2 h + r of the fragment.
        recast<uint32_t>(a)(4 * (c8 >> 1) + 2 * (c8 & 1) + r) = packed;
      }
    }
    scale0 = scale[0], scale1 = scale[1];
  };
  const auto issue = [&](auto& a, const int s) __attribute__((always_inline)) {
    warpgroup_fence_operand(a);
    wgmma_block(mma, a, tCrW(_, _, _, s), partial);
  };
  // Block kb's wgmma done: release its stage and promote as tok64 does (the scale products fl(token x weight)).
  const auto finish = [&](auto& a, const int s, const int kb, const float t0, const float t1)
                          __attribute__((always_inline)) {
    const float w_lo = __ldg(w_scale_lo + kb), w_hi = __ldg(w_scale_hi + kb);
    warpgroup_wait<0>();
    warpgroup_fence_operand(partial);
    warpgroup_fence_operand(a);
    __syncwarp();
    if (lane == 0) Barrier::arrive(&empty[s]);
    promote<T::kGroups>(acc, partial, upper_group, t0, t1, w_lo, w_hi);
  };
  const auto wait_stage = [&](const int kb) { Barrier::wait(&full[kb % S], uint32_t((kb / S) & 1)); };

  // Blocks in pairs so that each A register set is a compile-time choice: convert k + 1 while k's wgmma run.
  float t0 = 0.f, t1 = 0.f, u0 = 0.f, u1 = 0.f;
  wait_stage(0);
  convert(a0, 0, t0, t1);
  for (int kb = 0; kb < p.k_blocks; kb += 2) {
    issue(a0, kb % S);
    const bool second = kb + 1 < p.k_blocks;
    if (second) wait_stage(kb + 1), convert(a1, (kb + 1) % S, u0, u1);
    finish(a0, kb % S, kb, t0, t1);
    if (!second) break;
    issue(a1, (kb + 1) % S);
    if (kb + 2 < p.k_blocks) wait_stage(kb + 2), convert(a0, (kb + 2) % S, t0, t1);
    finish(a1, (kb + 1) % S, kb + 1, u0, u1);
  }

  // tok64's epilogue: a quad's four 8-column groups transposed so that a lane stores 16 bytes of one row.
  CUTLASS_PRAGMA_UNROLL
  for (int c = 0; c < T::kGroups / 4; ++c) {
    CUTLASS_PRAGMA_UNROLL
    for (int h = 0; h < 2; ++h) {
      uint32_t v[4];
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < 4; ++j)
        v[j] = blockfp8::pack_pair<bf16>(acc(16 * c + 4 * j + 2 * h), acc(16 * c + 4 * j + 2 * h + 1));
      tok64::quad_transpose(v, t);
      const int r = m0 + row + 8 * h, col = n0 + 8 * (4 * c + t);
      if (r < p.m && col < p.n)
        *reinterpret_cast<uint4*>(p.out + int64_t(r) * p.n + col) = make_uint4(v[0], v[1], v[2], v[3]);
    }
  }
}

template <int TileN>
void launch_fused(const CUtensorMap& x_map, const CUtensorMap& w_map, const Params& p, cudaStream_t stream) {
  const auto kernel = fused_gemm<TileN>;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile<TileN>::kSmem));
  kernel<<<p.m_tiles * (p.n / TileN), kThreads, Tile<TileN>::kSmem, stream>>>(x_map, w_map, p);
}

struct Case {
  const char* name;
  int n, k, m, tile_n;
};

// The register-A kernel's launcher over copy i of x.
template <int TileN>
struct RegisterA {
  static constexpr int kXBoxRows = kTok;
  const std::vector<CUtensorMap>& x_maps;
  const CUtensorMap& w_map;
  const Params& p;
  void operator()(int i, cudaStream_t s) const { launch_fused<TileN>(x_maps[i], w_map, p, s); }
};

// One case: the fused kernel (Fused<TileN>, whose x boxes are Fused<TileN>::kXBoxRows rows) against the two launches
// and cuBLAS bf16, bits and values checked first.
template <int TileN, template <int> class Fused = RegisterA>
void run(const Case& c, cublasHandle_t blas, FILE* json, bool& first) {
  const int m = c.m, n = c.n, k = c.k, k_blocks = k / kTileK;
  const size_t x_elems = size_t(m) * k;
  // Copies of x (the big operand on these layers) so that the graph's launches do not find it in L2.
  const int copies = int(std::clamp<size_t>(200000000 / (x_elems * 2) + 1, 2, 64));
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<bf16> x(x_elems);
  for (size_t i = 0; i < x_elems; ++i) x[i] = __float2bfloat16(normal(rng) * (i % 977 == 0 ? 30.f : 1.f));
  std::vector<uint8_t> w(size_t(n) * k);
  for (auto& b : w) b = __nv_cvt_float_to_fp8(normal(rng) * 64.f, __NV_SATFINITE, __NV_E4M3);
  std::vector<float> w_scale(size_t((n + 127) / 128) * k_blocks);
  for (auto& s : w_scale) s = std::ldexp(1.f + float(rng() % 64) / 64.f, -12 + int(rng() % 4));

  bf16 *d_x, *d_out_fused, *d_out_two, *d_out_blas, *d_w_bf16;
  uint8_t *d_w, *d_q;
  float *d_w_scale, *d_sx;
  CHECK(cudaMalloc(&d_x, x_elems * 2 * copies));
  CHECK(cudaMalloc(&d_out_fused, size_t(m) * n * 2));
  CHECK(cudaMalloc(&d_out_two, size_t(m) * n * 2));
  CHECK(cudaMalloc(&d_out_blas, size_t(m) * n * 2));
  CHECK(cudaMalloc(&d_w_bf16, size_t(n) * k * 2));
  CHECK(cudaMalloc(&d_w, w.size()));
  CHECK(cudaMalloc(&d_q, x_elems));
  CHECK(cudaMalloc(&d_w_scale, w_scale.size() * 4));
  CHECK(cudaMalloc(&d_sx, size_t(k_blocks) * m * 4));
  for (int i = 0; i < copies; ++i) CHECK(cudaMemcpy(d_x + x_elems * i, x.data(), x_elems * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_w, w.data(), w.size(), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_w_scale, w_scale.data(), w_scale.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(d_out_fused, 0xff, size_t(m) * n * 2));  // NaN-poisoned: an unwritten output shows
  CHECK(cudaMemset(d_out_two, 0xff, size_t(m) * n * 2));

  std::vector<CUtensorMap> x_maps(copies);
  CUtensorMap w_map;
  for (int i = 0; i < copies; ++i)
    if (!tok64::encode(&x_maps[i], CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, d_x + x_elems * i, k, m, size_t(k) * 2, 64,
                       Fused<TileN>::kXBoxRows, CU_TENSOR_MAP_SWIZZLE_128B))
      std::fprintf(stderr, "x map failed\n"), std::exit(1);
  if (!tok64::encode(&w_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, d_w, k, n, k, kTileK, TileN, CU_TENSOR_MAP_SWIZZLE_128B))
    std::fprintf(stderr, "w map failed\n"), std::exit(1);
  const Params fp{d_w_scale, d_out_fused, m, n, k_blocks, m / kTok};

  blockfp8::quant::TokenGroupProblem qp;
  qp.q = d_q, qp.s = d_sx, qp.m = m, qp.k = k, qp.x_stride = k, qp.s_ld = m, qp.bf16 = true;
  blockfp8::gemm::Problem gp;
  gp.a = d_q, gp.a_scale = d_sx, gp.a_scale_ld = m, gp.b = d_w, gp.b_scale = d_w_scale, gp.d = d_out_two;
  gp.m = m, gp.n = n, gp.k = k, gp.out_bf16 = true, gp.sm_count = 132, gp.arch = 90;
  blockfp8::gemm::Plan plan;
  plan.tile_n = TileN, plan.pdl = false;
  const blockfp8::quant::DequantProblem dp{d_w, d_w_scale, d_w_bf16, n, k, true};
  CHECK(blockfp8::quant::launch_dequant_weight(dp, nullptr));

  const Fused<TileN> fused{x_maps, w_map, fp};
  auto two = [&](int i, cudaStream_t s) {
    qp.x = d_x + x_elems * i;
    CHECK(blockfp8::quant::launch(0, qp, s));
    CHECK(tok64::launch(gp, plan, s));
  };
  auto blas_gemm = [&](int i, cudaStream_t s) {
    const float one = 1.f, zero = 0.f;
    cublasSetStream(blas, s);
    // out^T [n, m] = w [n, k] . x^T: column-major view of row-major out [m, n].
    if (cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, d_w_bf16, CUDA_R_16BF, k, d_x + x_elems * i,
                     CUDA_R_16BF, k, &zero, d_out_blas, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
      std::fprintf(stderr, "cublasGemmEx failed\n"), std::exit(1);
  };
  fused(0, nullptr);
  two(0, nullptr);
  blas_gemm(0, nullptr);
  CHECK(cudaDeviceSynchronize());

  // Bits: fused against the two launches; values: both against fp64 over the quantizer's own q and sx.
  std::vector<bf16> out_fused(size_t(m) * n), out_two(size_t(m) * n);
  std::vector<uint8_t> q(x_elems);
  std::vector<float> sx(size_t(k_blocks) * m);
  CHECK(cudaMemcpy(out_fused.data(), d_out_fused, out_fused.size() * 2, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(out_two.data(), d_out_two, out_two.size() * 2, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(q.data(), d_q, q.size(), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(sx.data(), d_sx, sx.size() * 4, cudaMemcpyDeviceToHost));
  size_t differ = 0;
  for (size_t i = 0; i < out_fused.size(); ++i)
    differ += std::memcmp(&out_fused[i], &out_two[i], 2) != 0;
  float fp8[256];
  for (int b = 0; b < 256; ++b) {
    __nv_fp8_e4m3 v;
    v.__x = __nv_fp8_storage_t(b);
    fp8[b] = float(v);
  }
  double max_err = 0, max_ref = 0;
  for (int r = 0; r < m; r += std::max(1, m / 16))
    for (int col = 0; col < n; ++col) {
      double ref = 0;
      for (int kb = 0; kb < k_blocks; ++kb) {
        double dot = 0;
        for (int j = kb * kTileK; j < (kb + 1) * kTileK; ++j)
          dot += double(fp8[q[size_t(r) * k + j]]) * fp8[w[size_t(col) * k + j]];
        ref += dot * sx[size_t(kb) * m + r] * w_scale[size_t(col / 128) * k_blocks + kb];
      }
      max_ref = std::max(max_ref, std::fabs(ref));
      max_err = std::max(max_err, std::fabs(double(__bfloat162float(out_fused[size_t(r) * n + col])) - ref));
    }

  const GraphTiming t_fused = time_graph(fused, copies), t_two = time_graph(two, copies),
                    t_blas = time_graph(blas_gemm, copies);
  std::printf("%-22s %5d %5d %5d %4d %9.2f %9.2f %9.2f %8.3f %8.3f %9zu %10.2e\n", c.name, m, n, k, TileN, t_fused.us,
              t_two.us, t_blas.us, t_fused.us / t_two.us, t_fused.us / t_blas.us, differ, max_err / max_ref);
  std::fprintf(json,
               "%s{\"shape\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, \"tile_n\": %d, \"fused_us\": %.3f, "
               "\"quant_tok64_us\": %.3f, \"cublas_bf16_us\": %.3f, \"outputs_differing\": %zu, "
               "\"max_rel_err\": %.3e, \"x_copies\": %d}",
               first ? "" : ",\n", c.name, m, n, k, TileN, t_fused.us, t_two.us, t_blas.us, differ, max_err / max_ref,
               copies);
  first = false;
  for (void* ptr : {(void*)d_x, (void*)d_out_fused, (void*)d_out_two, (void*)d_out_blas, (void*)d_w_bf16, (void*)d_w,
                    (void*)d_q, (void*)d_w_scale, (void*)d_sx})
    CHECK(cudaFree(ptr));
}

}  // namespace fused_probe

#ifndef NARROW_FUSED_NO_MAIN
int main(int argc, char** argv) {
  using namespace fused_probe;
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cublasHandle_t blas;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) return std::fprintf(stderr, "cublasCreate failed\n"), 1;
  // shapes.NARROW_LONG_K's layers whose N the widths divide, at a mid and two prefill M.
  const Case cases[] = {
      {"dsv3.kv_a.576x7168", 576, 7168, 256, 64},   {"dsv3.kv_a.576x7168", 576, 7168, 256, 96},
      {"dsv3.kv_a.576x7168", 576, 7168, 1024, 96},  {"dsv3.kv_a.576x7168", 576, 7168, 4096, 96},
      {"dsv3.kv_a.576x7168", 576, 7168, 4096, 64},  {"dsv3.4096x7168.tp8", 512, 7168, 1024, 128},
      {"dsv3.4096x7168.tp8", 512, 7168, 4096, 128}, {"qwen3-8b.qkv.tp8", 768, 4096, 1024, 96},
      {"qwen3-8b.qkv.tp8", 768, 4096, 4096, 96},    {"llama3-70b.qkv.tp8", 1280, 8192, 4096, 128},
  };
  FILE* json = argc > 1 ? open_probe_json(argv[1], sms, "") : std::fopen("/dev/null", "w");
  std::printf("%-22s %5s %5s %5s %4s %9s %9s %9s %8s %8s %9s %10s\n", "layer", "M", "N", "K", "W", "fused_us",
              "two_us", "bf16_us", "f/two", "f/bf16", "differ", "rel_err");
  bool first = true;
  for (const Case& c : cases) {
    if (c.tile_n == 64) run<64>(c, blas, json, first);
    if (c.tile_n == 96) run<96>(c, blas, json, first);
    if (c.tile_n == 128) run<128>(c, blas, json, first);
  }
  std::fprintf(json, "\n]}\n");
  std::fclose(json);
  std::printf("fused: bf16 x quantized in the GEMM; two: the extension's quantizer + tok64 (same width); bf16: "
              "cuBLAS on the dequantized weight; differ: fused outputs whose bits differ from two's\n");
  return 0;
}
#endif
