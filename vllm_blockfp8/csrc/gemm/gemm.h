// W8A8 block-scaled FP8 GEMM: the C++ boundary between ops.cpp and the arch kernels.
//
//   D[m, n] = sum_kb (sum_{k in block kb} A[m, k] * B[n, k]) * SFA[m, kb] * SFB[n / 128, kb]
//
// A   fp8 e4m3 [m, k] row-major (K contiguous), activations.
// SFA fp32, one scale per token per 128 values of K, stored M-MAJOR: element (row, kb) lives at
//     a_scale[kb * a_scale_ld + row]; a_scale_ld % 4 == 0 and a_scale_ld >= m (the quantizer
//     writes a_scale_ld = round_up(m, 4) so that each column is a 16-byte aligned TMA row).
// B   fp8 e4m3 [n, k] row-major (K contiguous), weights.
// SFB fp32 [ceil(n / 128), k / 128] row-major (contiguous), one scale per 128x128 weight block.
// D   bf16 or fp16 [m, n] row-major, ld = n. Written in full, never read.
// Scales multiply to dequantize and are used exactly as given (no power-of-two rounding).
//
// Supported: any m >= 1, n % 8 == 0 (16-byte rows for the TMA store of D), k % 128 == 0.
// No torch types here: ops.cpp converts tensors into a Problem.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "../common/tile_row.h"

namespace blockfp8::gemm {

struct Problem {
  const void* a = nullptr;         // fp8 e4m3 [m, k], 16-byte aligned
  const float* a_scale = nullptr;  // M-major, see above; 16-byte aligned (read by TMA)
  int64_t a_scale_ld = 0;          // elements between scale columns; % 4 == 0, >= m
  const void* b = nullptr;         // fp8 e4m3 [n, k], 16-byte aligned
  const float* b_scale = nullptr;  // fp32 [ceil(n / 128), k / 128] contiguous
  void* d = nullptr;               // bf16/fp16 [m, n], 16-byte aligned
  int64_t m = 0, n = 0, k = 0;
  bool out_bf16 = true;            // false: fp16
  int sm_count = 0;                // multiprocessors of the device (> 0; sizes persistent grids)
  // Persistent tile order: raster -1 = the arch file's default for this problem (sm90.cu), 0 =
  // CUTLASS's heuristic, 1 = along M, 2 = along N; max_swizzle 1, 2, 4 or 8 (read when raster >= 0).
  // ops.cpp sets them only from BLOCKFP8_SM90_RASTER / _SWIZZLE (benchmark switches), which CUTLASS then
  // takes as given. fit_swizzle (set by sm90.cu for its default order) lowers the swizzle until CUTLASS
  // pads the tile grid no further than whole clusters (sm90_kernel.cuh, launch_swizzle).
  int raster = -1;
  int max_swizzle = 1;
  bool fit_swizzle = false;
  // Benchmark switches set by ops.cpp from BLOCKFP8_SM90_SPLITS / BLOCKFP8_SM90_REDUCTION: on split-K
  // capable rows (Config::kSplitK) splits > 0 replaces the row's split rule (1 = never split; capped at
  // the K blocks); on every stream-K-scheduler row nondeterministic_reduction lets the partial tiles
  // (split-K or stream-K) add in arrival order.
  int splits = 0;
  bool nondeterministic_reduction = false;
  // Benchmark switch BLOCKFP8_SM90_TILE_N (ops.cpp): the weight-tile width of the 64-token-tile row
  // (sm90_tok64.h's kTileWidths) in place of its per-problem rule; 0 = the rule.
  int tile_n = 0;
  // Programmatic dependent launch (ops.cpp: BLOCKFP8_SM90_PDL, by default where K <= 4096): the GEMM may launch
  // before the previous kernel on the stream ends (where that kernel triggers it, as the quantizer
  // does); its CTAs set up (barriers, descriptors) and wait in griddepcontrol.wait before their first
  // global read (sm90_kernel.cuh).
  bool pdl = false;
  void* workspace = nullptr;       // >= workspace_bytes(row, problem) bytes, 16-byte aligned
  size_t workspace_size = 0;
};

// Rows of this arch's tile table, in selection order (selection stops at the first row unbounded in m
// that carries no selection precondition; rows after it are forced-only candidates).
int num_rows();
const TileRow& row(int i);

// nullptr if row i can run p, else a sentence saying why not (static storage, never freed).
const char* rejects(int i, const Problem& p);

// First row with max_m >= p.m that does not reject p and whose selection precondition (a speed
// rule some rows carry, e.g. "its tiles fill one wave") holds; -1 if none.
int select(const Problem& p);

// Device scratch that launch(i, p) needs (stream-K partial tiles and their flags); 0 when none.
// Depends on m, n, k, sm_count and the tile order only, so the caller can size it before filling
// the pointers.
// launch() zeroes what it needs on the stream itself, so the buffer may come uninitialized.
size_t workspace_bytes(int i, const Problem& p);

// How row i runs p along K: whole (data-parallel), CUTLASS's stream-K, CUTLASS's split-K into
// `splits` partial tiles, or `slices` K slices run as one batched launch plus a sum kernel; and the
// persistent tile order it launches with (raster 0 heuristic / 1 along M / 2 along N, the swizzle
// CUTLASS ends up using). Host logic only (sizes and sm_count; the benchmark switches in p
// included), for logs and tests.
struct KPlan {
  bool stream_k = false;
  int splits = 1;
  int slices = 1;
  int raster = 0;
  int swizzle = 1;
  int tile_n = 0;  // the kernel's N tile where the row picks it per problem (sm90_tok64.h), else 0
};
KPlan k_plan(int i, const Problem& p);

// Enqueues row i on stream s. Never synchronizes and never allocates, so it can be captured in a
// CUDA graph. Returns cudaErrorInvalidValue if rejects(i, p) != nullptr or the workspace is too
// small; otherwise the launch status.
cudaError_t launch(int i, const Problem& p, cudaStream_t s);

}  // namespace blockfp8::gemm
