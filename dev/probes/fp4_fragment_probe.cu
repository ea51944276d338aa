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
// Scale fragment, three formats (fp4_frag_scales.cuh): per (R, S) the scales of lane group g (rows g, g + 8, steps
// 0-3) together, as e4m3 (the checkpoint's bytes, permuted), as bf16 bits of scale * 2^119 (converted once at load:
// 2 bytes a scale), or as exp8 (one byte a scale, 3 instructions per two scales; zero-scale groups' codes zeroed).
// x: the product kernel's cp.async ring with the 128-byte swizzle (w4a16_wgmma.cuh), 4 stages, TOK tokens.
//
// A third design keeps today's packing (the GEMV's; no second copy of the weight): permx_wgmma_kernel permutes x's
// K order inside a stage instead, so that each lane owns 16 contiguous elements of its two rows (see there).
//
// Side by side in one run, no K split (the shapes fill the GPU with output tiles), bf16, CUDA graphs over weight
// copies that do not fit L2: the product's paired wgmma kernel (w4a16_wgmma_kernel), the permuted-x kernel on the
// same bytes, the fragment kernel with each scale format. Each is first checked against a naive
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
#include "fp4_frag_scales.cuh"
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
template <int TOK, Scales S>
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
  const ScaleVec<S>* s_next = static_cast<const ScaleVec<S>*>(s_frag) + int64_t(tile) * stages * 8 + g;

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
  ScaleVec<S> sq[kPrefetch];
  auto load_w = [&](int p) {
    wq[p] = sm80::load_weight(w_next);
    sq[p] = load_scales<S>(s_next, 0);
    w_next += 32;
    s_next += 8;
  };
  run_stages(stages, copy_x, load_w, [&](int kt, int p) {
    const uint64_t desc = sw128_kmajor_desc(ring + (uint32_t(kt) % kFragStages) * kXBytes);
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
      uint32_t f[4];
      fragment_step<S>(wq[p], sq[p], kk, f);
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

enum class Impl { kPaired, kPermX, kFragE4m3, kFragBf16, kFragExp8 };
const char* impl_name(Impl i) {
  return i == Impl::kPaired ? "paired_wgmma" : i == Impl::kPermX ? "paired_permx" :
         i == Impl::kFragE4m3 ? "frag_e4m3_scales" : i == Impl::kFragBf16 ? "frag_bf16_scales" : "frag_exp8_scales";
}

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
    frag_wgmma_kernel<TOK, Scales::kE4m3><<<grid, kThreads, frag_smem_bytes<TOK>(), st>>>(
        x, reinterpret_cast<const uint4*>(o.frag), o.frag_s8, gs, out, m, n, k, k);
  } else if (impl == Impl::kFragBf16) {
    frag_wgmma_kernel<TOK, Scales::kBf16><<<grid, kThreads, frag_smem_bytes<TOK>(), st>>>(
        x, reinterpret_cast<const uint4*>(o.frag), o.frag_s16, gs, out, m, n, k, k);
  } else {
    frag_wgmma_kernel<TOK, Scales::kExp8><<<grid, kThreads, frag_smem_bytes<TOK>(), st>>>(
        x, reinterpret_cast<const uint4*>(o.frag_z), o.frag_x8, gs, out, m, n, k, k);
  }
}

template <int TOK>
void set_attributes() {
  CHECK(cudaFuncSetAttribute(w4a16_wgmma_kernel<TOK, bf16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             WgmmaTile<TOK>::kSmemBytes));
  CHECK(cudaFuncSetAttribute(permx_wgmma_kernel<TOK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             frag_smem_bytes<TOK>()));
  CHECK(cudaFuncSetAttribute(frag_wgmma_kernel<TOK, Scales::kE4m3>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             frag_smem_bytes<TOK>()));
  CHECK(cudaFuncSetAttribute(frag_wgmma_kernel<TOK, Scales::kBf16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             frag_smem_bytes<TOK>()));
  CHECK(cudaFuncSetAttribute(frag_wgmma_kernel<TOK, Scales::kExp8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             frag_smem_bytes<TOK>()));
}

void launch_tok(int tok, Impl impl, const Operands& o, const bf16* x, const float* gs, bf16* out, int m, int n, int k,
                cudaStream_t st) {
  if (tok == 64) launch<64>(impl, o, x, gs, out, m, n, k, st);
  else if (tok == 128) launch<128>(impl, o, x, gs, out, m, n, k, st);
  else launch<256>(impl, o, x, gs, out, m, n, k, st);
}

}  // namespace probe

int main(int argc, char** argv) {
  using namespace probe;
  const char* path = argc > 1 ? argv[1] : "fp4_fragment_probe.json";
  set_attributes<64>();
  set_attributes<128>();
  set_attributes<256>();
  std::mt19937 rng(0);
  const Impl impls[] = {Impl::kPaired, Impl::kPermX, Impl::kFragE4m3, Impl::kFragBf16, Impl::kFragExp8};
  constexpr int kImpls = 5;
  bool ok = true;
  for (int tok : {64, 128, 256})
    for (Impl impl : impls) {
      const double worst = check_launch(tok - 3, 512, 1024, rng, [&](const Operands& o, const bf16* x, const float* gs,
                                                                      bf16* out, cudaStream_t st) {
        launch_tok(tok, impl, o, x, gs, out, tok - 3, 512, 1024, st);
      });
      std::printf("check %-17s tok %3d M %3d N 512 K 1024: worst error / bound %.3f %s\n", impl_name(impl), tok,
                  tok - 3, worst, worst <= 1.0 ? "ok" : "FAIL");
      ok = ok && worst <= 1.0;
    }

  cudaStream_t st;
  CHECK(cudaStreamCreate(&st));
  const double rate = copy_rate(st);
  FILE* f = open_json(path, "fp4_fragment_probe", rate, ok);
  // Shapes whose output tiles fill the GPU at every M here without a K split (192-256 128-row tiles).
  const int shapes[][2] = {{24576, 1536}, {24576, 4096}, {32768, 512}};
  bool first = true;
  std::printf("N x K, M, the token tile, the floor (us); then each variant: us (x the floor)\n");
  for (const auto& shape : shapes) {
    const int n = shape[0], k = shape[1];
    const std::vector<Operands> copies = timing_copies(rng, n, k);
    for (int m : {32, 64, 128, 256}) {
      const int tok = m <= 64 ? 64 : m <= 128 ? 128 : 256;
      const Point pt(m, n, k, rate);
      std::printf("%6dx%-6d M %3d tok %3d floor %5.1f:", n, k, m, tok, pt.floor_us);
      std::fprintf(f, "%s  {\"n\": %d, \"k\": %d, \"m\": %d, \"tok\": %d, \"floor_us\": %.3f", first ? "" : ",\n", n,
                   k, m, tok, pt.floor_us);
      for (int i = 0; i < kImpls; ++i) {  // the bf16-scale variant reads 1/16 byte per weight more: not in its floor
        const double us = time_launch(copies, [&](const Operands& o, cudaStream_t s) {
          launch_tok(tok, impls[i], o, pt.x, pt.gs, pt.out, m, n, k, s);
        });
        record(f, impl_name(impls[i]), us, pt.floor_us);
      }
      std::printf("\n");
      std::fprintf(f, "}");
      first = false;
    }
    for (auto& o : copies) free_operands(o);
  }
  return close_json(f, ok);
}
