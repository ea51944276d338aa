// NVFP4 W4A16 wgmma GEMMs that decode whole words (an H200 diagnostic; not part of the extension).
//
// Question (fp4/NOTES.md, "The SM90 wgmma rows"): the wgmma rows issue 262 instructions per warp per 64-deep stage
// (1024 weights; 0.256 per weight where the memory floor affords ~0.125 at full issue) and run 4.5-7x the floor at
// M = 32-64. Most of it is decode and scale work that the row-contiguous paired packing forces on the A fragment:
// the 4 lanes of a quad read the same words and each keeps a quarter, and each converts the same two scales per
// step. Two ways to decode whole words instead: a packing in the A fragment's order made once at load, or today's
// packing with x's K order permuted inside a stage. Do they take the count to ~110-150 and the time towards the
// floor?
//
//   out[m, n] = global_scale[n] * sum_k x[m, k] * e2m1(code[n, k]) * e4m3(scale[n, k / 16])     (bf16 x and out)
//
// Fragment packing: for each 16-row tile R and 64-deep K stage S, 512 bytes at (R * K / 64 + S) * 512; lane
// l = 4 g + t's 16 bytes at 16 l are 4 words, word kk (k16 step kk) holding its wgmma A fragment's 8 codes in the
// paired bit order (reference.NVFP4_PAIRED_BITS, decode.cuh's decode_paired): elements (0, 1) = row g, k 2t and
// 2t + 1; (2, 3) = row g + 8, same k; (4, 5) = row g, k 2t + 8, 2t + 9; (6, 7) = row g + 8, same k (k relative to
// 64 S + 16 kk). So decode_paired's pairs ARE the fragment registers a[0..3]. A lane loads its 16 bytes straight
// into registers (no shared memory: the bytes are its own), kPrefetch stages ahead.
// Scale fragment, two variants: e4m3 (the checkpoint's bytes, permuted): per (R, S) 64 bytes, group g's 8 at 8 g,
// bytes 0-3 = row g's scales of steps 0-3, 4-7 = row g + 8's; or bf16 (converted once at load to the bits of
// scale * 2^119 that the HMUL2 multiplies by, decode.cuh): per (R, S) 128 bytes, group g's 16 at 16 g, words
// {row g steps 0, 1}, {row g steps 2, 3}, {row g + 8 steps 0, 1}, {row g + 8 steps 2, 3}, low half first.
// x: the product kernel's cp.async ring with the 128-byte swizzle (w4a16_wgmma.cuh), 4 stages, TOK tokens.
//
// A third design keeps today's packing (the GEMV's; no second copy of the weight): permx_wgmma_kernel permutes x's
// K order inside a stage instead, so that each lane owns 16 contiguous elements of its two rows (see there).
//
// Side by side in one run, no K split (the shapes fill the GPU with output tiles), bf16, CUDA graphs over weight
// copies that do not fit L2: the product's paired wgmma kernel (w4a16_wgmma_kernel), the permuted-x kernel on the
// same bytes, the fragment kernel with e4m3 scales, and with bf16 scales. Each is first checked against a naive
// fp32 reference kernel on a ragged problem (M = TOK - 3). Printed and written as JSON: us, the floor (bytes over
// the measured copy rate), x the floor.
//
// Build and run (the H200 stage `fp4_fragment_probe` of dev/device/h200_check.sh does this):
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
//        dev/probes/fp4_fragment_probe.cu -o probe && ./probe out.json
// The instruction count needs no GPU: add -cubin, then
//   cuobjdump -sass probe.cubin | python dev/ncu/sass_opcode_counts.py --loop --match "wgmma"
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "../../vllm_blockfp8/csrc/fp4/sm90/w4a16_wgmma.cuh"
#include "fp4_probe_data.cuh"

namespace probe {

using namespace blockfp8::fp4;
using namespace blockfp8::fp4::sm90;
using bf16 = __nv_bfloat16;
namespace sm80 = blockfp8::sm80;

constexpr int kFragStages = 4;  // x ring; kFragStages - 2 stages loading while two are read
constexpr int kPrefetch = 4;    // weight (and scale) stages held in registers per lane

template <int TOK>
constexpr int frag_smem_bytes() { return kFragStages * TOK * kXRowBytes + 1024; }

template <bool BF16_SCALES>
using ScaleVec = std::conditional_t<BF16_SCALES, uint4, uint2>;

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
template <bool BF16_SCALES>
__device__ __forceinline__ void step_scales(const ScaleVec<BF16_SCALES>& s, int kk, uint32_t& s0, uint32_t& s1) {
  if constexpr (BF16_SCALES) {
    const uint32_t g = (kk >> 1) ? s.y : s.x, g8 = (kk >> 1) ? s.w : s.z;
    const __nv_bfloat162 vg = sm80::bit_cast<__nv_bfloat162>(g), vg8 = sm80::bit_cast<__nv_bfloat162>(g8);
    s0 = sm80::bit_cast<uint32_t>((kk & 1) ? __high2bfloat162(vg) : __low2bfloat162(vg));
    s1 = sm80::bit_cast<uint32_t>((kk & 1) ? __high2bfloat162(vg8) : __low2bfloat162(vg8));
  } else {
    scale_pair_halves(perm(s.x, s.y, uint32_t(kk) | (uint32_t(kk + 4) << 4)), s0, s1);
  }
}

template <bool BF16_SCALES>
__device__ __forceinline__ ScaleVec<BF16_SCALES> load_scales(const ScaleVec<BF16_SCALES>* base, int64_t index) {
  if constexpr (BF16_SCALES) {
    return sm80::load_weight(base + index);
  } else {
    return __ldg(base + index);
  }
}

// The dynamic shared window rounded up to the 1024-byte swizzle atom (the x ring starts there).
__device__ __forceinline__ uint32_t ring_address(const uint8_t* smem_raw) {
  return (sm80::smem_addr(smem_raw) + 1023u) & ~1023u;
}

// The K loop both kernels share: kFragStages - 2 x stages and kPrefetch weight stages issued ahead, then per stage:
// wait for its x, publish it to both warpgroups (the barrier also orders the slot's reuse: the wgmma that read it
// retired before), issue the next x stage, run `stage(kt, p)`. p = kt % kPrefetch is a constant after unrolling: it
// indexes the register ring, which `stage` refills with load_w(p) once it has read it.
template <typename CopyX, typename LoadW, typename Stage>
__device__ __forceinline__ void run_stages(int stages, CopyX&& copy_x, LoadW&& load_w, Stage&& stage) {
  constexpr int kAhead = kFragStages - 2;
  uint32_t x_next = 0;  // unsigned: the ring slot is a mask, not a signed modulo
  auto load_x = [&]() {  // copy_x(slot) issues stage x_next's copies into ring slot `slot`; past the end an empty group
    if (x_next < uint32_t(stages)) copy_x(x_next % kFragStages);
    sm80::cp_async_commit();
    ++x_next;
  };
#pragma unroll
  for (int s = 0; s < kAhead; ++s) load_x();
#pragma unroll
  for (int p = 0; p < kPrefetch; ++p)
    if (p < stages) load_w(p);
  for (int kt0 = 0; kt0 < stages; kt0 += kPrefetch) {
#pragma unroll
    for (int p = 0; p < kPrefetch; ++p) {
      const int kt = kt0 + p;
      if (kt >= stages) break;
      sm80::cp_async_wait<kAhead - 1>();
      fence_proxy_async_shared();
      __syncthreads();
      load_x();
      stage(kt, p);
    }
  }
}

// One k16 step: the register A fragment f times the x tile's step (desc) into acc; the step before it retires.
template <int TOK>
__device__ __forceinline__ void wgmma_step(float (&acc)[TOK / 2], const uint32_t (&f)[4], uint64_t desc) {
  wgmma_fence();
  Wgmma<TOK, bf16>::mma(acc, f, desc);
  wgmma_commit();
  wgmma_wait<1>();
}

// Retires the last wgmma and the (empty) copy groups, then writes the CTA's tile: acc * global_scale * 2^7 as bf16.
template <int TOK>
__device__ __forceinline__ void store_tile(float (&acc)[TOK / 2], const float* global_scale, bf16* out, int m, int n) {
  wgmma_wait<0>();
#pragma unroll
  for (int j = 0; j < TOK / 2; ++j) fence_operand(acc[j]);
  sm80::cp_async_wait<0>();
  const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  const int tok0 = blockIdx.x * TOK, row0 = blockIdx.y * kRows;
#pragma unroll
  for (int j = 0; j < TOK / 2; ++j) {
    const int col = row0 + d_row(warp, g, j), tok = tok0 + d_token(t, j);
    if (tok < m && col < n) out[int64_t(tok) * n + col] = __float2bfloat16(acc[j] * global_scale[col] * kUnbias);
  }
}

// One CTA: 128 weight rows (8 warps, warp w the 16-row tile 8 blockIdx.y + w) x TOK tokens, all of K. N % 128 == 0,
// K % 64 == 0, x rows 16-byte aligned.
template <int TOK, bool BF16_SCALES>
__global__ void __launch_bounds__(kThreads, TOK == 256 ? 1 : 2)
    frag_wgmma_kernel(const bf16* __restrict__ x, const uint4* __restrict__ w_frag, const void* __restrict__ s_frag,
                      const float* __restrict__ global_scale, bf16* __restrict__ out, int m, int n, int k,
                      int64_t x_stride) {
  constexpr int kXBytes = TOK * kXRowBytes;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t ring = ring_address(smem_raw);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2;
  const int tok0 = blockIdx.x * TOK, tile = blockIdx.y * 8 + warp;
  const int stages = k / kStageK;
  // This lane's 16 bytes of (tile, stage 0); each stage 32 uint4 further. Scales: 8 groups per (tile, stage). The
  // pointers advance by a constant per stage, so no address is rebuilt inside the loop.
  const uint4* w_next = w_frag + int64_t(tile) * stages * 32 + lane;
  const ScaleVec<BF16_SCALES>* s_next = static_cast<const ScaleVec<BF16_SCALES>*>(s_frag) + int64_t(tile) * stages * 8 + g;

  // x copies: this thread's rows xr + 32 it (valid or zero-filled: fixed over K), chunk xc; the source advances
  // 64 elements a stage, the destination by a stage's bytes around the ring.
  constexpr int kXCopies = TOK * 8 / kThreads;
  const int xr = tid >> 3, xc = tid & 7;
  const bf16* x_src[kXCopies];
  uint32_t x_dst[kXCopies];
  int x_bytes[kXCopies];
#pragma unroll
  for (int it = 0; it < kXCopies; ++it) {
    const bool in = tok0 + xr + 32 * it < m;
    x_src[it] = x + (in ? int64_t(tok0 + xr + 32 * it) * x_stride + 8 * xc : 0);
    x_dst[it] = ring + x_offset(xr + 32 * it, xc);
    x_bytes[it] = in ? 16 : 0;
  }
  auto copy_x = [&](uint32_t slot) {
#pragma unroll
    for (int it = 0; it < kXCopies; ++it) {
      sm80::cp_async16_zfill(x_dst[it] + slot * kXBytes, x_src[it], x_bytes[it]);  // 0 bytes: reads nothing
      x_src[it] += kStageK;
    }
  };

  float acc[TOK / 2];
#pragma unroll
  for (int j = 0; j < TOK / 2; ++j) acc[j] = 0.f;
  uint4 wq[kPrefetch];
  ScaleVec<BF16_SCALES> sq[kPrefetch];
  auto load_w = [&](int p) {
    wq[p] = sm80::load_weight(w_next);
    sq[p] = load_scales<BF16_SCALES>(s_next, 0);
    w_next += 32;
    s_next += 8;
  };
  run_stages(stages, copy_x, load_w, [&](int kt, int p) {
    const uint64_t desc = sw128_kmajor_desc(ring + (uint32_t(kt) % kFragStages) * kXBytes);
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
      uint32_t f[4], s0, s1;
      decode_paired<bf16>(sm80::word(wq[p], kk), f);
      step_scales<BF16_SCALES>(sq[p], kk, s0, s1);
      f[0] = mul2<bf16>(f[0], s0);
      f[1] = mul2<bf16>(f[1], s1);
      f[2] = mul2<bf16>(f[2], s0);
      f[3] = mul2<bf16>(f[3], s1);
      // The last step has read this stage's registers: refill them kPrefetch stages ahead.
      if (kk == kSteps - 1 && kt + kPrefetch < stages) load_w(p);
      wgmma_step<TOK>(acc, f, desc + 2 * kk);  // + 32 bytes: the descriptor counts 16-byte units
    }
  });
  store_tile<TOK>(acc, global_scale, out, m, n);
}

// ---- today's paired packing, x permuted in shared memory ------------------------------------------------------
//
// The same operands as the product kernel (b in the paired packing, row-contiguous, what the GEMV reads; e4m3
// scales [n, k / 16]); only the K order inside a stage changes, and K is a reduction axis. Lane (g, t) owns the 16
// contiguous elements [16 t, 16 t + 16) of the stage in rows g and g + 8: two paired words each (8 bytes, one
// load per row), decoded whole (decode_paired: pairs P0..P3 of word 2t, then of word 2t + 1), and ONE scale group
// per row for the whole stage. Step kk feeds slot pair (2t, 2t + 1) with elements 16t + 4kk + {0, 1} and (2t + 8,
// 2t + 9) with 16t + 4kk + {2, 3}, so the x tile in shared memory holds, at pair position q = 8 kk + 4 h + t of a
// token row, x's pair 8 t + 2 kk + h: each thread copies whole 16-byte x chunks as four 4-byte cp.async (see the
// copies below), 128-byte swizzle as before.
template <int TOK>
__global__ void __launch_bounds__(kThreads, TOK == 256 ? 1 : 2)
    permx_wgmma_kernel(const bf16* __restrict__ x, const uint8_t* __restrict__ b, const uint8_t* __restrict__ b_scale,
                       const float* __restrict__ global_scale, bf16* __restrict__ out, int m, int n, int k,
                       int64_t x_stride) {
  constexpr int kXBytes = TOK * kXRowBytes;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t ring = ring_address(smem_raw);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int tok0 = blockIdx.x * TOK, row0 = blockIdx.y * kRows;
  const int stages = k / kStageK;
  // Rows past N read row N - 1 (their outputs are never stored).
  const int r0 = min(row0 + 16 * warp + g, n - 1), r1 = min(row0 + 16 * warp + g + 8, n - 1);
  const uint2* w0_next = reinterpret_cast<const uint2*>(b + int64_t(r0) * (k / 2) + 8 * t);
  const uint2* w1_next = reinterpret_cast<const uint2*>(b + int64_t(r1) * (k / 2) + 8 * t);
  const uint32_t* s0_next = reinterpret_cast<const uint32_t*>(b_scale + int64_t(r0) * (k / kGroup));
  const uint32_t* s1_next = reinterpret_cast<const uint32_t*>(b_scale + int64_t(r1) * (k / kGroup));
  const uint32_t pick = uint32_t(t) | (uint32_t(t + 4) << 4);  // byte t of each row's 4 scales of a stage

  // x copies. Pair position q = 8 kk + 4 h + t' of a token row holds x's pair 8 t' + 2 kk + h, so shared chunk s
  // (= q / 4 = 2 kk + h) holds pairs s, 8 + s, 16 + s, 24 + s: x's 16-byte chunk c = 2 t' + p spreads its 4 pairs j
  // over shared chunks 4 p + j, slot t'. Each thread copies whole x chunks (xc = tid % 8 of rows xr + 32 it, as the
  // product kernel) in four 4-byte cp.async from one source address; the four destinations are fixed over K.
  constexpr int kXCopies = TOK * 8 / kThreads;
  const int xr = tid >> 3, xc = tid & 7;
  uint32_t x_dst[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) x_dst[j] = ring + xr * kXRowBytes + 16 * ((4 * (xc & 1) + j) ^ (xr & 7)) + 4 * (xc >> 1);
  const bf16* x_src[kXCopies];
  int x_bytes[kXCopies];
#pragma unroll
  for (int it = 0; it < kXCopies; ++it) {
    const bool in = tok0 + xr + 32 * it < m;
    x_src[it] = x + (in ? int64_t(tok0 + xr + 32 * it) * x_stride + 8 * xc : 0);
    x_bytes[it] = in ? 4 : 0;
  }
  auto copy_x = [&](uint32_t slot) {
#pragma unroll
    for (int it = 0; it < kXCopies; ++it) {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        cp_async4_zfill(x_dst[j] + slot * kXBytes + it * 32 * kXRowBytes, x_src[it] + 2 * j, x_bytes[it]);
      x_src[it] += kStageK;
    }
  };

  float acc[TOK / 2];
#pragma unroll
  for (int j = 0; j < TOK / 2; ++j) acc[j] = 0.f;
  uint2 wq0[kPrefetch], wq1[kPrefetch];
  uint32_t sq0[kPrefetch], sq1[kPrefetch];
  auto load_w = [&](int p) {
    wq0[p] = __ldg(w0_next);
    wq1[p] = __ldg(w1_next);
    sq0[p] = __ldg(s0_next);
    sq1[p] = __ldg(s1_next);
    w0_next += 4, w1_next += 4, s0_next += 1, s1_next += 1;  // 32 packed bytes and 4 scales a stage
  };
  run_stages(stages, copy_x, load_w, [&](int kt, int p) {
    const uint64_t desc = sw128_kmajor_desc(ring + (uint32_t(kt) % kFragStages) * kXBytes);
    uint32_t sc0, sc1;  // this stage's scale of row g, of row g + 8, for every step
    scale_pair_halves(perm(sq0[p], sq1[p], pick), sc0, sc1);
    uint32_t pg[4], pg8[4];
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
      if ((kk & 1) == 0) {  // a new word of each row: elements 16t + 8 (kk / 2) .. + 7
        decode_paired<bf16>(kk == 0 ? wq0[p].x : wq0[p].y, pg);
        decode_paired<bf16>(kk == 0 ? wq1[p].x : wq1[p].y, pg8);
      }
      const int j = 2 * (kk & 1);
      const uint32_t f[4] = {mul2<bf16>(pg[j], sc0), mul2<bf16>(pg8[j], sc1), mul2<bf16>(pg[j + 1], sc0),
                             mul2<bf16>(pg8[j + 1], sc1)};
      if (kk == kSteps - 1 && kt + kPrefetch < stages) load_w(p);
      wgmma_step<TOK>(acc, f, desc + 2 * kk);
    }
  });
  store_tile<TOK>(acc, global_scale, out, m, n);
}

// ---- launching and timing ----------------------------------------------------------------------------------------

enum class Impl { kPaired, kPermX, kFragE4m3, kFragBf16 };
const char* impl_name(Impl i) {
  return i == Impl::kPaired ? "paired_wgmma" : i == Impl::kPermX ? "paired_permx" :
         i == Impl::kFragE4m3 ? "frag_e4m3_scales" : "frag_bf16_scales";
}

struct Operands {  // one weight copy in every packing
  uint8_t *paired, *scales, *frag, *frag_s8, *frag_s16;
};

template <int TOK>
void launch(Impl impl, const Operands& o, const bf16* x, const float* gs, bf16* out, int m, int n, int k,
            cudaStream_t st) {
  const dim3 grid(unsigned((m + TOK - 1) / TOK), unsigned(n / kRows));
  if (impl == Impl::kPaired) {
    const Args<bf16> a{x, o.paired, o.scales, gs, 1, nullptr, out, m, n, k, k, n};
    w4a16_wgmma_kernel<TOK, bf16><<<grid, kThreads, WgmmaTile<TOK>::kSmemBytes, st>>>(a, nullptr);
  } else if (impl == Impl::kPermX) {
    permx_wgmma_kernel<TOK><<<grid, kThreads, frag_smem_bytes<TOK>(), st>>>(x, o.paired, o.scales, gs, out, m, n, k, k);
  } else if (impl == Impl::kFragE4m3) {
    frag_wgmma_kernel<TOK, false><<<grid, kThreads, frag_smem_bytes<TOK>(), st>>>(
        x, reinterpret_cast<const uint4*>(o.frag), o.frag_s8, gs, out, m, n, k, k);
  } else {
    frag_wgmma_kernel<TOK, true><<<grid, kThreads, frag_smem_bytes<TOK>(), st>>>(
        x, reinterpret_cast<const uint4*>(o.frag), o.frag_s16, gs, out, m, n, k, k);
  }
}

template <int TOK>
void set_attributes() {
  CHECK(cudaFuncSetAttribute(w4a16_wgmma_kernel<TOK, bf16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             WgmmaTile<TOK>::kSmemBytes));
  CHECK(cudaFuncSetAttribute(permx_wgmma_kernel<TOK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             frag_smem_bytes<TOK>()));
  CHECK(cudaFuncSetAttribute(frag_wgmma_kernel<TOK, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             frag_smem_bytes<TOK>()));
  CHECK(cudaFuncSetAttribute(frag_wgmma_kernel<TOK, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             frag_smem_bytes<TOK>()));
}

void launch_tok(int tok, Impl impl, const Operands& o, const bf16* x, const float* gs, bf16* out, int m, int n, int k,
                cudaStream_t st) {
  if (tok == 64) launch<64>(impl, o, x, gs, out, m, n, k, st);
  else if (tok == 128) launch<128>(impl, o, x, gs, out, m, n, k, st);
  else launch<256>(impl, o, x, gs, out, m, n, k, st);
}

// Largest |out - ref| / (2^-8 |ref| + 2^-16 sum |terms|): bf16 output rounding plus fp32 accumulation order; a wrong
// code or scale among K moves a sum by ~sum |terms| / K, far above the second term. <= 1 passes.
double check_tok(int tok, Impl impl, int m, int n, int k, std::mt19937& rng) {
  std::vector<uint8_t> codes(size_t(n) * k);
  for (auto& c : codes) c = uint8_t(rng() & 15);
  const std::vector<uint8_t> scales = random_scales(rng, size_t(n) * k / 16);
  std::vector<bf16> xh(size_t(m) * k);
  std::normal_distribution<float> normal;
  for (auto& v : xh) v = __float2bfloat16(normal(rng));
  const Packed p = pack(codes, scales, n, k);
  Operands o{upload(p.paired), upload(scales), upload(p.frag), upload(p.frag_s8), upload(p.frag_s16)};
  bf16* x = upload(xh);
  float* gs = upload(std::vector<float>(n, 1.f));
  uint8_t* dcodes = upload(codes);
  float *ref, *abs_sum;
  bf16* out;
  CHECK(cudaMalloc(&ref, size_t(m) * n * 4));
  CHECK(cudaMalloc(&abs_sum, size_t(m) * n * 4));
  CHECK(cudaMalloc(&out, size_t(m) * n * 2));
  CHECK(cudaMemset(out, 0xff, size_t(m) * n * 2));  // NaN: an output never written fails
  reference_kernel<<<unsigned((int64_t(m) * n + 255) / 256), 256>>>(x, dcodes, o.scales, ref, abs_sum, m, n, k);
  launch_tok(tok, impl, o, x, gs, out, m, n, k, 0);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  std::vector<float> r(size_t(m) * n), a(size_t(m) * n);
  std::vector<bf16> got(size_t(m) * n);
  CHECK(cudaMemcpy(r.data(), ref, r.size() * 4, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(a.data(), abs_sum, a.size() * 4, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(got.data(), out, got.size() * 2, cudaMemcpyDeviceToHost));
  double worst = 0.0;
  for (size_t i = 0; i < r.size(); ++i) {
    const double err = std::fabs(double(__bfloat162float(got[i])) - r[i]);
    const double ratio = err / (std::ldexp(std::fabs(r[i]), -8) + std::ldexp(a[i], -16) + 1e-30);
    worst = std::isnan(ratio) ? INFINITY : std::max(worst, ratio);
  }
  for (void* ptr : {(void*)o.paired, (void*)o.scales, (void*)o.frag, (void*)o.frag_s8, (void*)o.frag_s16, (void*)x,
                    (void*)gs, (void*)dcodes, (void*)ref, (void*)abs_sum, (void*)out})
    CHECK(cudaFree(ptr));
  return worst;
}

// Microseconds per launch: a graph of `copies` launches, one per weight copy (together larger than L2), replayed.
double time_tok(int tok, Impl impl, const std::vector<Operands>& copies, const bf16* x, const float* gs, bf16* out,
                int m, int n, int k, cudaStream_t st) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  for (const Operands& o : copies) launch_tok(tok, impl, o, x, gs, out, m, n, k, st);
  CHECK(cudaStreamEndCapture(st, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 3; ++i) CHECK(cudaGraphLaunch(exec, st));
  constexpr int kReplays = 20;
  const float ms = elapsed_ms(st, [&] {
    for (int i = 0; i < kReplays; ++i) CHECK(cudaGraphLaunch(exec, st));
  });
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  return 1e3 * ms / (kReplays * copies.size());
}

}  // namespace probe

int main(int argc, char** argv) {
  using namespace probe;
  const char* path = argc > 1 ? argv[1] : "fp4_fragment_probe.json";
  set_attributes<64>();
  set_attributes<128>();
  set_attributes<256>();
  std::mt19937 rng(0);
  const Impl impls[] = {Impl::kPaired, Impl::kPermX, Impl::kFragE4m3, Impl::kFragBf16};
  constexpr int kImpls = 4;
  bool ok = true;
  for (int tok : {64, 128, 256})
    for (Impl impl : impls) {
      const double worst = check_tok(tok, impl, tok - 3, 512, 1024, rng);
      std::printf("check %-17s tok %3d M %3d N 512 K 1024: worst error / bound %.3f %s\n", impl_name(impl), tok,
                  tok - 3, worst, worst <= 1.0 ? "ok" : "FAIL");
      ok = ok && worst <= 1.0;
    }

  cudaStream_t st;
  CHECK(cudaStreamCreate(&st));
  const double rate = copy_rate(st);
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  FILE* f = std::fopen(path, "w");
  const char* git = std::getenv("BLOCKFP8_GIT_STATE");
  std::fprintf(f, "{\"probe\": \"fp4_fragment_probe\", \"gpu\": \"%s\", \"git\": \"%s\", \"sms\": %d, "
               "\"copy_bytes_per_s\": %.4g, \"checks_passed\": %s, \"results\": [\n",
               prop.name, git ? git : "unknown", sms, rate, ok ? "true" : "false");
  // Shapes whose output tiles fill the GPU at every M here without a K split (192-256 128-row tiles).
  const int shapes[][2] = {{24576, 1536}, {24576, 4096}, {32768, 512}};
  bool first = true;
  std::printf("%-14s %5s %4s %8s", "N x K", "M", "tok", "floor");
  for (Impl impl : impls) std::printf(" %17s", impl_name(impl));
  std::printf("   (us, and x the floor)\n");
  for (const auto& shape : shapes) {
    const int n = shape[0], k = shape[1];
    const size_t wbytes = size_t(n) * k / 2, sbytes = size_t(n) * k / 16;
    const int ncopies = int(std::max<size_t>(2, (size_t(160) << 20) / (wbytes + sbytes) + 1));
    std::vector<probe::Operands> copies(ncopies);
    for (auto& o : copies) {  // random bytes: every code is valid; scales from the same safe range
      std::vector<uint8_t> w(wbytes), s8 = random_scales(rng, sbytes), s16(2 * sbytes);
      for (auto& b : w) b = uint8_t(rng());
      for (size_t i = 0; i < sbytes; ++i) {
        const uint16_t h = scale_bits(s8[i]);
        std::memcpy(&s16[2 * i], &h, 2);
      }
      o = {upload(w), upload(s8), upload(w), upload(s8), upload(s16)};
    }
    for (int m : {32, 64, 128, 256}) {
      const int tok = m <= 64 ? 64 : m <= 128 ? 128 : 256;
      std::vector<bf16> xh(size_t(m) * k, __float2bfloat16(0.5f));
      bf16* x = upload(xh);
      float* gs = upload(std::vector<float>(n, 1.f));
      bf16* out;
      CHECK(cudaMalloc(&out, size_t(m) * n * 2));
      const double floor_us = 1e6 * double(wbytes + sbytes + size_t(m) * k * 2 + size_t(m) * n * 2) / rate;
      std::printf("%6dx%-7d %5d %4d %8.1f", n, k, m, tok, floor_us);
      std::fprintf(f, "%s  {\"n\": %d, \"k\": %d, \"m\": %d, \"tok\": %d, \"floor_us\": %.3f", first ? "" : ",\n", n,
                   k, m, tok, floor_us);
      for (int i = 0; i < kImpls; ++i) {  // the bf16-scale variant reads 1/16 byte per weight more: not in its floor
        const double us = time_tok(tok, impls[i], copies, x, gs, out, m, n, k, st);
        std::printf(" %9.1f (%5.2fx)", us, us / floor_us);
        std::fprintf(f, ", \"%s_us\": %.3f", impl_name(impls[i]), us);
      }
      std::printf("\n");
      std::fprintf(f, "}");
      first = false;
      CHECK(cudaFree(x));
      CHECK(cudaFree(gs));
      CHECK(cudaFree(out));
    }
    for (auto& o : copies)
      for (void* ptr : {(void*)o.paired, (void*)o.scales, (void*)o.frag, (void*)o.frag_s8, (void*)o.frag_s16})
        CHECK(cudaFree(ptr));
  }
  std::fprintf(f, "\n]}\n");
  std::fclose(f);
  return ok ? 0 : 1;
}
