// SM90 (sm_90a only) W4A16 GEMM for NVFP4 weights on wgmma, the decoded weight as the register A operand:
//
//   out[m, n] = global_scale[n] * sum_k x[m, k] * e2m1(code[n, k]) * scale[n, k / 16] (+ bias[n])
//
// Layouts as fp4.h: x 16-bit [m, k] (row stride x_stride); the weight in the fragment packing only (fragment.cuh,
// reference.fragment_nvfp4_weight: each lane's 16 bytes of a (16-row tile, 64-deep stage) are its A fragment for
// the stage's 4 k16 steps; exp8 scales beside them). Swap-AB: the wgmma M extent is weight rows (64 per warpgroup),
// its N extent tokens. A CTA of two warpgroups (256 threads) computes 128 weight rows (warp w: the 16-row tile
// 8 blockIdx.y + w) x TOK tokens (TOK = 32, 64, 128, 256) over its share of K. gridDim.z splits K in one of two ways:
// launched as clusters of gridDim.z CTAs along z, the splits of a tile sum their accumulators through distributed
// shared memory and each stores a 1 / gridDim.z share of the output (no global traffic, no second kernel); launched
// without clusters, split z writes fp32 partials that sm80.cu's w4a16_reduce_kernel sums. Both add the splits in
// order 0, 1, ... from zero, so they give the same bits.
// x runs in 64-wide stages through a cp.async ring of kXStages slots (every thread copies; zero-fill past M):
// [TOK][64] 16-bit, one 128-byte row per token, 16-byte chunk c of row r at chunk c ^ (r % 8): the K-major
// 128-byte-swizzle layout the wgmma B descriptor reads (wgmma.cuh). The weight and scales never touch shared memory:
// each lane loads its own 16 bytes and 8 scale bytes of a stage straight into registers, kPrefetch stages ahead.
// Per k16 step a lane decodes one word whole (fragment_step: the paired decode, one HMUL2 per pair by its row's
// exp8 scale: e2m1 * scale * 2^-7, exact) and the warpgroup issues one register-A wgmma; at most one in flight
// (wait_group 1), so the next step's decode runs under it.
// Shared-memory reuse: iteration i loads x stage i + kXStages - 2 into the slot of stage i - 2, whose wgmma every
// warpgroup has retired (wait_group 1 after stage i - 1's first step) before the barrier that precedes the load.
// Tiles past N (N % 16 == 0, N % 128 need not be) re-read the last tile and are never stored.
// Epilogue: fp32 accumulators * global_scale * 2^7 (kUnbias) + bias in fp32 (scale_and_bias, gemv.cuh), one rounding to
// 16 bits; unsplit, the 16-bit tile staged in the ring (stmatrix) and stored as 16-byte pieces of token rows; split,
// the cluster reduction (this split's fp32 tile [TOK][kReduceStride] in the ring, 8-byte stores of 4 rows) or the fp32
// partials. Numerics: decode.cuh (exact operands, fp32 accumulation).
// Unsupported: the row-contiguous packings (ModelOpt's, paired: the layer stores the fragment packing on SM90),
// x rows not 16-byte aligned, out rows not 16-byte aligned, N > 65535 * 128, any GPU but SM90 (compute capability 9.0).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "../../common/convert.cuh"
#include "../../common/sm80.cuh"
#include "../fragment.cuh"
#include "../gemv.cuh"
#include "wgmma.cuh"

// Phase marks, empty in the extension: dev/probes/fp4_wgmma_phase_probe.cu defines them before including this header
// to time where a wave goes (thread 0 passing mark i where `when` holds; each warp's exit).
#ifndef BLOCKFP8_WGMMA_PHASE
#define BLOCKFP8_WGMMA_PHASE(i, when)
#define BLOCKFP8_WGMMA_PHASE_END()
#endif

namespace blockfp8::fp4::sm90 {

constexpr int kRows = 128;               // weight rows per CTA: two warpgroups of 64, 8 16-row tiles
constexpr int kThreads = 256;
constexpr int kStageK = kFragK;          // K per stage: one 128-byte swizzle row of x per token
constexpr int kXRowBytes = kStageK * 2;  // 128
constexpr int kSteps = kStageK / 16;     // k16 steps (wgmma) per stage
constexpr int kXStages = 4;              // x ring: two stages loading while two are read
constexpr int kPrefetch = 4;             // weight and scale stages held in registers per lane
// fp32 per token row of the cluster reduction's tile: + 4 puts the D fragment's 4 token columns (2t) on different
// banks (2t x 132 = 8t mod 32), so a warp's stores of one d[j] hit 32 distinct banks.
constexpr int kReduceStride = kRows + 4;
// Bytes per token row of the unsplit epilogue's output tile ([token][128 rows] 16-bit, over the ring): + 16 puts the
// 8 token rows a stmatrix phase writes on 8 different 16-byte bank groups.
constexpr int kOutPitch = kRows * 2 + 16;

template <int TOK>
struct WgmmaTile {
  static_assert(TOK == 32 || TOK == 64 || TOK == 128 || TOK == 256, "wgmma N extent: 32, 64, 128 or 256 tokens");
  // CTAs per SM the registers are capped for (128 registers at 2, 85 at 3): the 32-token tile's 16 accumulators fit
  // 3 (80 registers; at 4, 64 registers, ptxas spilled inside the loop), whose extra warps keep more loads in flight.
  static constexpr int kMinBlocks = TOK == 256 ? 1 : TOK == 32 ? 3 : 2;
  static constexpr int kXBytes = TOK * kXRowBytes;       // a multiple of the 1024-byte swizzle atom
  static constexpr int kReduceBytes = TOK * kReduceStride * 4;  // the cluster reduction's tile, over the ring
  // + 1024: slack to align the ring, whatever the dynamic shared window's own alignment.
  static constexpr int kSmemBytes = (kXStages * kXBytes > kReduceBytes ? kXStages * kXBytes : kReduceBytes) + 1024;
  static_assert(TOK * kOutPitch <= kXStages * kXBytes, "the output tile is staged in the ring");
};

// Byte offset of 16-byte chunk c (0..7) of token row r in an x stage: the 128-byte swizzle.
__host__ __device__ constexpr uint32_t x_offset(int r, int c) { return uint32_t(r * kXRowBytes + 16 * (c ^ (r & 7))); }

// The D fragment's coordinates (wgmma.cuh): d[j] of lane (g, t) in warp `warp` (0-7 of the CTA) is tile row
// d_row(warp, g, j) and tile token d_token(t, j).
__host__ __device__ constexpr int d_row(int warp, int g, int j) { return 16 * warp + g + 8 * ((j >> 1) & 1); }
__host__ __device__ constexpr int d_token(int t, int j) { return 8 * (j >> 2) + 2 * t + (j & 1); }

template <int TOK, typename T>
__global__ void __launch_bounds__(kThreads, WgmmaTile<TOK>::kMinBlocks)
    w4a16_wgmma_kernel(const Args<T> a, float* partials) {
  using Tile = WgmmaTile<TOK>;
  constexpr int kAhead = kXStages - 2;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t ring = (sm80::smem_addr(smem_raw) + 1023u) & ~1023u;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int tok0 = blockIdx.x * TOK, row0 = blockIdx.y * kRows;
  BLOCKFP8_WGMMA_PHASE(0, true);
  // This split's stages [kt0, kt1) (an empty split writes zero partials).
  const int stages_k = a.k / kStageK;
  const int per_split = (stages_k + int(gridDim.z) - 1) / int(gridDim.z);
  const int kt0 = min(stages_k, int(blockIdx.z) * per_split), kt1 = min(stages_k, kt0 + per_split);
  const int stages = kt1 - kt0;

  // This lane's 16 code bytes and its group's 8 scale bytes of (tile, stage kt0); a stage further is one block
  // further, so no address is rebuilt inside the loop. A tile past N reads the last one (never stored).
  const int tile = min(row0 / kFragRows + warp, a.n / kFragRows - 1);
  const uint4* w_next = reinterpret_cast<const uint4*>(a.b) + (int64_t(tile) * stages_k + kt0) * kFragBlockWords + lane;
  const uint2* s_next =
      reinterpret_cast<const uint2*>(a.b_scale) + (int64_t(tile) * stages_k + kt0) * kFragScaleWords + g;

  // x copies: this thread's rows xr + 32 it, chunk xc; the source advances 64 elements a stage, the destination by a
  // stage's bytes around the ring. Rows past M are never copied (cp.async with many lanes on one address is slow:
  // fp4/NOTES.md); their slots are zeroed once here, before the first stage's proxy fence and barrier.
  constexpr int kXCopies = TOK * 8 / kThreads;
  const int xr = tid >> 3, xc = tid & 7;
  const int live_copies = (a.m - tok0 - xr + 31) >> 5;  // rows xr + 32 it < M - tok0 for it < live_copies
  const T* x_src[kXCopies];
  uint32_t x_dst[kXCopies];
#pragma unroll
  for (int it = 0; it < kXCopies; ++it) {
    x_src[it] = a.x + (it < live_copies ? int64_t(tok0 + xr + 32 * it) * a.x_stride + 8 * xc + int64_t(kt0) * kStageK : 0);
    x_dst[it] = ring + x_offset(xr + 32 * it, xc);
    if (it >= live_copies)
#pragma unroll
      for (int slot = 0; slot < kXStages; ++slot)
        sm80::st_shared_zero16(x_dst[it] + uint32_t(slot) * Tile::kXBytes);
  }
  int x_next = 0;  // the next x stage to copy, relative to kt0
  auto load_x = [&]() {  // past the end an empty group: the wait counts stay uniform
    if (x_next < stages) {
      const uint32_t slot = uint32_t(x_next % kXStages) * Tile::kXBytes;
#pragma unroll
      for (int it = 0; it < kXCopies; ++it) {
        if (it < live_copies) sm80::cp_async16_zfill(x_dst[it] + slot, x_src[it], 16);
        x_src[it] += kStageK;
      }
    }
    sm80::cp_async_commit();
    ++x_next;
  };

  float acc[TOK / 2];
#pragma unroll
  for (int j = 0; j < TOK / 2; ++j) acc[j] = 0.f;
  uint4 wq[kPrefetch];
  uint2 sq[kPrefetch];
  auto load_w = [&](int p) {
    wq[p] = sm80::load_weight(w_next);
    sq[p] = __ldg(s_next);
    w_next += kFragBlockWords;
    s_next += kFragScaleWords;
  };
#pragma unroll
  for (int s = 0; s < kAhead; ++s) load_x();
#pragma unroll
  for (int p = 0; p < kPrefetch; ++p)
    if (p < stages) load_w(p);

  for (int i0 = 0; i0 < stages; i0 += kPrefetch) {
#pragma unroll
    for (int p = 0; p < kPrefetch; ++p) {  // p = i % kPrefetch is a constant: it indexes the register ring
      const int i = i0 + p;
      if (i >= stages) break;
      sm80::cp_async_wait<kAhead - 1>();  // this thread's copies of stage i landed
      fence_proxy_async_shared();         // ... and are ordered before the async proxy's (wgmma's) reads
      __syncthreads();                    // everyone's copies; every warpgroup retired its wgmma of stage i - 2
      BLOCKFP8_WGMMA_PHASE(1, i == 0);
      load_x();
      const uint64_t desc = sw128_kmajor_desc(ring + uint32_t(i % kXStages) * Tile::kXBytes);
#pragma unroll
      for (int kk = 0; kk < kSteps; ++kk) {
        uint32_t f[4];
        fragment_step<T>(wq[p], sq[p], kk, f);
        // The last step has read this stage's registers: refill them kPrefetch stages ahead.
        if (kk == kSteps - 1 && i + kPrefetch < stages) load_w(p);
        wgmma_fence();  // f was written by this thread
        Wgmma<TOK, T>::mma(acc, f, desc + 2 * kk);  // + 32 bytes a step: the descriptor counts 16-byte units
        wgmma_commit();
        wgmma_wait<1>();  // the previous step's wgmma (and its registers) retired; this one runs under the next decode
      }
      BLOCKFP8_WGMMA_PHASE(2, i == 0);
    }
  }
  wgmma_wait<0>();
  BLOCKFP8_WGMMA_PHASE(3, true);
#pragma unroll
  for (int j = 0; j < TOK / 2; ++j) fence_operand(acc[j]);
  sm80::cp_async_wait<0>();  // only empty groups remain; none may be pending at exit

  if (gridDim.z > 1 && partials == nullptr) {
    // The cluster reduction. Every warpgroup's wgmmas have read the ring (wait_group 0 above is per warpgroup) once
    // all threads pass this barrier; then the ring holds this split's tile [token][row].
    __syncthreads();
#pragma unroll
    for (int j = 0; j < TOK / 2; ++j) {
      const uint32_t at = ring + uint32_t((d_token(t, j) * kReduceStride + d_row(warp, g, j)) * 4);
      asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(at), "f"(acc[j]) : "memory");
    }
    cluster_sync();  // every split's tile is written and visible to the cluster
    // CTA `rank` sums 4-row pieces rank, rank + splits, ... (in 256-piece strides) over the splits in order and stores
    // each as one 8-byte store (a warp: 256 contiguous bytes). 256 % 32 == 0, so a thread's pieces are always the same
    // 4 rows: their scales and bias are read once.
    const int rank = int(cluster_ctarank()), splits = int(cluster_nctarank());
    const int r4 = 4 * (tid % (kRows / 4)), col = row0 + r4;
    float scale4[4] = {0.f, 0.f, 0.f, 0.f}, bias4[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (col < a.n) {  // N % 16 == 0: the piece's 4 rows are all in or all out
        scale4[e] = a.global_scale[(col + e) * a.global_scale_stride] * kUnbias;
        if (a.bias != nullptr) bias4[e] = to_float(a.bias[col + e]);
      }
    for (int piece = rank * kThreads + tid; piece < TOK * (kRows / 4); piece += splits * kThreads) {
      const int tok = piece / (kRows / 4), token = tok0 + tok;
      if (token >= a.m || col >= a.n) continue;
      const uint32_t at = ring + uint32_t((tok * kReduceStride + r4) * 4);
      float sum[4] = {0.f, 0.f, 0.f, 0.f};
      for (int q = 0; q < splits; ++q) {
        const float4 v = ld_shared_cluster_f4(at, uint32_t(q));
        sum[0] += v.x, sum[1] += v.y, sum[2] += v.z, sum[3] += v.w;
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) sum[e] = scale_and_bias(sum[e], scale4[e], bias4[e], a.bias != nullptr);
      *reinterpret_cast<uint2*>(a.out + int64_t(token) * a.out_stride + col) =
          make_uint2(pack_pair<T>(sum[0], sum[1]), pack_pair<T>(sum[2], sum[3]));
    }
    cluster_sync();  // no CTA exits, releasing its shared memory, while another still reads it
    BLOCKFP8_WGMMA_PHASE_END();
    return;
  }

  if (gridDim.z > 1) {  // splits summed by the reduce kernel: fp32 partials [split][m][n] (whole sectors per store)
#pragma unroll
    for (int j = 0; j < TOK / 2; ++j) {
      const int tok = tok0 + d_token(t, j), col = row0 + d_row(warp, g, j);
      if (tok < a.m && col < a.n) partials[(int64_t(blockIdx.z) * a.m + tok) * a.n + col] = acc[j];
    }
    BLOCKFP8_WGMMA_PHASE_END();
    return;
  }

  // Unsplit: the output tile goes through shared memory, [token][128 rows] 16-bit, and leaves as 16-byte pieces of
  // token rows. Stored from the accumulators, each 2-byte store fills half of 4 sectors: that epilogue took ~8 us of a
  // wave of 128x256 tiles against ~3.5 us for this one (an H100, dev/probes/fp4_wgmma_phase_probe.cu).
  float scale[2] = {0.f, 0.f}, bias[2] = {0.f, 0.f};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int col = row0 + d_row(warp, g, 2 * h);  // d[j]'s row for (j / 2) % 2 == h
    if (col < a.n) {
      scale[h] = a.global_scale[col * a.global_scale_stride] * kUnbias;
      if (a.bias != nullptr) bias[h] = to_float(a.bias[col]);
    }
  }
  auto finish = [&](float acc_j, int h) { return scale_and_bias(acc_j, scale[h], bias[h], a.bias != nullptr); };
  __syncthreads();  // every warpgroup's wgmmas have read the ring
  // stmatrix x4 (transposed) per two 8-token blocks q, q + 1: matrix i is (rows 8 (i % 2) of the warp's 16, tokens
  // 8 (q + i / 2)), whose lane (g, t) pair is d[4 q + 2 i], d[4 q + 2 i + 1] (tokens 2t, 2t + 1 of row g).
  const int mi = lane >> 3, mr = lane & 7;
  const uint32_t st_base = ring + uint32_t((8 * (mi >> 1) + mr) * kOutPitch + (16 * warp + 8 * (mi & 1)) * 2);
#pragma unroll
  for (int q = 0; q < TOK / 8; q += 2) {
    uint32_t r[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      r[i] = pack_pair<T>(finish(acc[4 * q + 2 * i], i & 1), finish(acc[4 * q + 2 * i + 1], i & 1));
    stmatrix_x4_trans(st_base + uint32_t(8 * q * kOutPitch), r);
  }
  __syncthreads();
  // 16 16-byte pieces per token row (out rows 16-byte aligned: rejects_t); N % 16 == 0, so a piece's 8 rows are all in
  // or all out.
  for (int piece = tid; piece < TOK * 16; piece += kThreads) {
    const int tok = piece >> 4, c = piece & 15, token = tok0 + tok, out_col = row0 + 8 * c;
    if (token >= a.m || out_col >= a.n) continue;
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(ring + uint32_t(tok * kOutPitch + 16 * c)));
    *reinterpret_cast<uint4*>(a.out + int64_t(token) * a.out_stride + out_col) = v;
  }
  BLOCKFP8_WGMMA_PHASE_END();
}

}  // namespace blockfp8::fp4::sm90
