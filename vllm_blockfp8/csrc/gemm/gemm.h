// W8A8 block-scaled FP8 GEMM: the family boundary between ops.cpp and the arch code (csrc/gemm/<arch>/: sm89 on
// mma.sync, sm90 on wgmma, sm120 on CUTLASS's SM120 blockwise collective). gemm.cpp routes each call to the arch
// table named by Problem::arch; arch.h lists what every arch exports.
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
// Supported: any m >= 1, k % 128 == 0; each arch adds its own limits (rejects()), e.g. SM90's n % 8 == 0.
// No torch types here: ops.cpp converts tensors into a Problem. One call: plan() once (which row, how it runs along
// K, in which tile order, how it launches), then workspace_bytes() and launch() with that plan.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

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
  int arch = 90;                   // the row table that runs p: 89, 90 or 120 (table_arch() of the device)
  void* workspace = nullptr;       // >= workspace_bytes(problem, plan) bytes, 16-byte aligned
  size_t workspace_size = 0;
};

// How one call runs (the arch's planner computes it; host logic only, from the sizes, sm_count and the benchmark
// switches). Fields an arch does not use stay at their defaults.
struct Plan {
  int row = -1;  // the tile-table row; -1: no row takes the problem
  // Along K: whole (data-parallel), CUTLASS's stream-K, CUTLASS's split-K into `splits` partial tiles, or `slices`
  // K slices run as one batched launch plus a sum kernel.
  bool stream_k = false;
  int splits = 1;
  int slices = 1;
  // Persistent tile order: raster 0 = CUTLASS's heuristic, 1 = along M, 2 = along N; the swizzle CUTLASS ends up
  // using.
  int raster = 0;
  int swizzle = 1;
  int tile_n = 0;  // the kernel's N tile where the row picks it per problem (the 64-token-tile rows), else 0
  bool nondeterministic_reduction = false;  // partial tiles add in arrival order (a benchmark switch)
  bool pdl = false;  // programmatic dependent launch of the GEMM (and of its K-slice sum)
};

// The row table that serves a device of compute capability device_cc (major * 10 + minor): the table forced for
// this process (BLOCKFP8_GEMM_TABLE, set_table()) where its kernels run on that device, else the device's own
// (89, 90 or 120); 0 when this build has no W8A8 GEMM table for the device.
int table_arch(int device_cc);
// Forces a table for this process ("sm89", "sm90", "sm120"; "none": no table, so the linear op takes the GEMV or the
// dequantize + cuBLAS path; "auto" restores the device's own) and returns the previous setting's name; nullptr (nothing
// changed) for an unknown name. The SM89 rows are compiled for sm_90a too, so an H200
// runs them as forced rows; a forced table that cannot run on a device is ignored there.
const char* set_table(const char* name);
// True while "none" is in force (BLOCKFP8_GEMM_TABLE=none or set_table("none")): no call may take the W8A8 path.
bool off();
// True when this build compiled the table of `arch`.
bool built(int arch);

// What every arch's table needs (the contract above): nullptr, or why not (static storage). Each arch's rejects()
// starts with it and adds its own limits (alignment, TMA strides).
inline const char* contract_rejects(const Problem& p) {
  constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();
  if (p.m < 0 || p.n < 1 || p.k < 1) return "m must be >= 0, n and k >= 1";
  if (p.k % 128 != 0) return "k must be a multiple of 128 (one scale per 128 values of K)";
  if (p.m > kMaxInt32 || p.n > kMaxInt32 || p.k > kMaxInt32) return "m, n and k must fit in int32";
  if (p.a_scale_ld < p.m) return "a_scale_ld must be >= m";
  // The kernels index the scales with int32 strides.
  if (p.a_scale_ld > kMaxInt32 / (p.k / 128)) return "a_scale_ld * k / 128 must fit in int32";
  if (p.sm_count <= 0) return "sm_count must be > 0";
  return nullptr;
}
inline bool aligned(const void* ptr, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

// Rows of the table of `arch`, in table order (0 rows for an arch this build lacks).
int num_rows(int arch);
const TileRow& row(int arch, int i);

// nullptr if the GEMM can run p on p.arch's table (the rows of a table differ in speed only), else a sentence saying
// why not (static storage). Pointers are checked for alignment only, so shape-only problems (null pointers) can be
// asked.
const char* rejects(const Problem& p);

// The plan for p: the row p.arch's planner chooses (row = -1 where rejects(p) != nullptr), or `forced_row` (>= 0: run
// as given; the caller checks rejects(p) first), and how that row runs p. row = -1 for a forced_row out of range.
Plan plan(const Problem& p, int forced_row = -1);

// Device scratch that launch(p, plan) needs (stream-K partial tiles and their flags, K-slice partials); 0 when
// none. Depends on the sizes and the plan only, so the caller can size it before filling the pointers. launch()
// zeroes what it needs on the stream itself, so the buffer may come uninitialized.
size_t workspace_bytes(const Problem& p, const Plan& plan);

// Enqueues plan.row on stream s as planned. Never synchronizes and never allocates, so it can be captured in a
// CUDA graph. cudaErrorInvalidValue if rejects(p) != nullptr or the workspace is too small; otherwise the launch
// status.
cudaError_t launch(const Problem& p, const Plan& plan, cudaStream_t s);

// The SM90 launch mode (BLOCKFP8_SM90_PDL, sm90/options.cpp; read in every build, since the quantizer follows it):
// whether the activation quantizer before a GEMM over this K triggers the GEMM's early launch.
bool quant_triggers(int64_t k);
// Sets the launch mode ("0", "1" or "gemm") for this process; returns the previous mode's name, or nullptr (the
// mode unchanged) for an unknown name.
const char* set_pdl_mode(const char* mode);

}  // namespace blockfp8::gemm
