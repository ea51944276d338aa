// SM90 (sm_90a) W8A8 block-FP8 GEMM: the one row list. Each row names a kernel configuration (named fields below);
// setup.py generates one translation unit per CUTLASS row from this list at build time (`cutlass_kernel()` rows:
// kernels/cutlass_gemm.cuh instantiated for the row's Config), and the 64-token-tile rows run kernels/tok64.cu.
// Which row a problem gets, and how it runs along K, is plan.cpp's job (one function, one line per rule); the
// order here is the table order that tile_table, select_row and forced rows (row index) see.
//
// Row names, read left to right (the names are a public contract: tables, logs, benchmark JSON):
//   sm90_            the arch
//   swapab_          D^T = B A^T: weight rows on the wgmma M side (128 or 64), tokens on the narrow N side
//   coop_            unswapped: 128 tokens x 128 weight rows, two consumer warpgroups on one tile (cooperative)
//   AxBx128          the CTA tile in the kernel's operand order (weights x tokens when swapped), 128 deep in K
//   _pp              ping-pong: each consumer warpgroup on its own 64-row weight tile
//   _ovl             our consumer loop (kernels/overlap_mainloop.cuh): block k-1 promoted under block k's wgmma
//   _c2x1, _c1x1     thread-block cluster: 2x1 multicasts each weight tile to two token tiles; 1x1 none
//   _sk              CUTLASS's stream-K scheduler (stream-K where the last wave is thin)
//   _slicek          K slices: one batched fp32 launch plus a sum kernel, where the tiles leave SMs idle
//   _persistent      CUTLASS's persistent (data-parallel) scheduler on a swap row: a smaller kernel
//   _epi64x3         128x64 epilogue subtiles in 3 buffers, and the issue-ahead kernel (kernels/issue_ahead_kernel.cuh)
//   (no suffix)      swap rows: CUTLASS's stream-K scheduler, split-K capable; coop rows: persistent scheduler
//   tok64_fitn       our kernel (kernels/tok64.cu): 64-token tiles, the weight-tile width fitted per problem;
//                    _narrow: the same kernel on narrow layers above M = 256
#pragma once

#include <cstdint>

#include "../../common/tile_row.h"

namespace blockfp8::gemm::sm90 {

enum class Schedule {
  kCooperativeStreamK,  // stream-K capable scheduler: data-parallel, split-K or stream-K per problem (the plan)
  kCooperative,         // data-parallel persistent scheduler: no workspace, less fixed cost
  kPingpong,            // persistent, each consumer warpgroup on its own 64-row tile (swap-AB rows only)
};

// The math warpgroups' side of the mainloop on CUTLASS's blockwise-FP8 collective.
enum class Consumer {
  kCutlass,  // CUTLASS's own: each K block's wgmma drained, then promoted
  kOverlap,  // kernels/overlap_mainloop.cuh: block k-1 promoted under block k's wgmma
};

enum class KernelKind { kCutlass, kTok64 };

// A row's kernel, with named fields; kernels/config.h turns a CUTLASS row into its Config type. Fields (kernel
// operand order: weights x tokens when swapped):
//   swap_ab              tokens on the wgmma N side
//   tile_m, tile_n       the CTA tile; cluster_m, cluster_n the cluster
//   schedule, consumer   above
//   split_k              CUTLASS split-K allowed (stream-K scheduler rows)
//   slice_k              K slices allowed (swap rows; adds an fp32-output instantiation)
//   epilogue_n, store_stages  epilogue subtile width and buffers (0: CUTLASS's choice, 128x32 in two)
//   issue_ahead          the next tile's first K block issued before the epilogue (persistent, overlap loop)
struct Kernel {
  KernelKind kind = KernelKind::kCutlass;
  bool swap_ab = false;
  int tile_m = 128, tile_n = 128;
  int cluster_m = 1, cluster_n = 1;
  Schedule schedule = Schedule::kCooperative;
  Consumer consumer = Consumer::kCutlass;
  bool split_k = false, slice_k = false;
  int epilogue_n = 0, store_stages = 0;
  bool issue_ahead = false;

  constexpr Kernel swapped() const { Kernel k = *this; k.swap_ab = true; return k; }
  constexpr Kernel tile(int m, int n) const { Kernel k = *this; k.tile_m = m, k.tile_n = n; return k; }
  constexpr Kernel cluster(int m, int n) const { Kernel k = *this; k.cluster_m = m, k.cluster_n = n; return k; }
  constexpr Kernel on(Schedule s) const { Kernel k = *this; k.schedule = s; return k; }
  constexpr Kernel loop(Consumer c) const { Kernel k = *this; k.consumer = c; return k; }
  constexpr Kernel splits_k() const { Kernel k = *this; k.split_k = true; return k; }
  constexpr Kernel slices_k() const { Kernel k = *this; k.slice_k = true; return k; }
  constexpr Kernel epilogue(int n, int buffers) const { Kernel k = *this; k.epilogue_n = n, k.store_stages = buffers; return k; }
  constexpr Kernel issues_ahead() const { Kernel k = *this; k.issue_ahead = true; return k; }
};
constexpr Kernel cutlass_kernel() { return Kernel{}; }
constexpr Kernel tok64_kernel() { Kernel k; k.kind = KernelKind::kTok64; return k; }

// Row ids in table order (plan.cpp's rules name rows by these).
enum RowId : int {
  kSwap64x32Pp,
  kSwap128x32,
  kTok64,
  kSwap64x64Pp,
  kSwap128x64SliceK,
  kSwap128x64Persistent,
  kSwap128x64,
  kTok64Narrow,
  kCoop1x1Epilogue,
  kCoop1x1StreamK,
  kCoop2x1StreamK,
  kCoop2x1Epilogue,
  kCoop2x1,
  kNumRows
};

struct Row {
  RowId id;
  TileRow info;  // name, max_m (the largest M plan.cpp gives it), one-line reason
  Kernel kernel;
};

constexpr Schedule kPingpong = Schedule::kPingpong, kCoop = Schedule::kCooperative,
                   kStreamKSched = Schedule::kCooperativeStreamK;
constexpr Consumer kOverlap = Consumer::kOverlap;

// clang-format off
inline constexpr Row kRows[kNumRows] = {
  {kSwap64x32Pp, {"sm90_swapab_64x32x128_pp_ovl", 64,
      "M <= 64 where its 64-row weight tiles fill one wave (or 3 waves against the 128x32 row's 2): twice the CTAs "
      "of that row without splitting K"},
   cutlass_kernel().swapped().tile(64, 32).on(kPingpong).loop(kOverlap)},
  {kSwap128x32, {"sm90_swapab_128x32x128", 64,
      "M <= 48, and M <= 64 below 64 weight tiles of 64 rows: many small tiles, K slices where they leave SMs idle"},
   cutlass_kernel().swapped().tile(128, 32).on(kStreamKSched).splits_k().slices_k()},
  {kTok64, {"sm90_tok64_fitn", 128,
      "M in (64, 128] where its tiles, 32-96 or 144-192 wide, fill one wave from 96 tiles: 64-token tiles, the "
      "weight-tile width fitted to the wave"},
   tok64_kernel()},
  {kSwap64x64Pp, {"sm90_swapab_64x64x128_pp_ovl", 256,
      "M = 49..64 past one wave of 64x32 tiles, and M in (64, 256] where its 64-row tiles fill one wave (or the 128x64 "
      "row leaves a thin second wave at M = 112..128) and K runs whole"},
   cutlass_kernel().swapped().tile(64, 64).on(kPingpong).loop(kOverlap)},
  {kSwap128x64SliceK, {"sm90_swapab_128x64x128_ovl_slicek", 256,
      "M in (64, 256] where its K-slice rule cuts K: the 128x64 row with K slices in place of CUTLASS's split-K"},
   cutlass_kernel().swapped().tile(128, 64).on(kStreamKSched).loop(kOverlap).splits_k().slices_k()},
  {kSwap128x64Persistent, {"sm90_swapab_128x64x128_ovl_persistent", 256,
      "where the 128x64 row runs K whole: the same tile on the persistent scheduler, ~0.5 us less fixed cost a call"},
   cutlass_kernel().swapped().tile(128, 64).on(kCoop).loop(kOverlap)},
  {kSwap128x64, {"sm90_swapab_128x64x128_ovl", 256,
      "M in (64, 128], and up to 256 where its tiles need no more waves than the 128x128 row's: one 64-token tile "
      "per weight tile; split-K or stream-K on long K"},
   cutlass_kernel().swapped().tile(128, 64).on(kStreamKSched).loop(kOverlap).splits_k()},
  {kTok64Narrow, {"sm90_tok64_fitn_narrow", kUnboundedM,
      "M > 256 where one wave of its tiles loads at most 3/4 of the bytes per SM of the 128x128 rows (narrow layers)"},
   tok64_kernel()},
  {kCoop1x1Epilogue, {"sm90_coop_128x128x128_c1x1_ovl_epi64x3", kUnboundedM,
      "where the 2x1 rows' padding tiles (odd token-tile counts) cost a round: the `_epi64x3` row without the cluster"},
   cutlass_kernel().tile(128, 128).on(kCoop).loop(kOverlap).epilogue(64, 3).issues_ahead()},
  {kCoop1x1StreamK, {"sm90_coop_128x128x128_c1x1_ovl_sk", kUnboundedM,
      "where only the real tiles' last round is thin (past one round, K >= 48 blocks): the `_sk` row without the "
      "cluster"},
   cutlass_kernel().tile(128, 128).on(kStreamKSched).loop(kOverlap)},
  {kCoop2x1StreamK, {"sm90_coop_128x128x128_c2x1_ovl_sk", kUnboundedM,
      "where the last wave is at most 40% full and K >= 48 blocks: the 128x128 row with that wave run as stream-K"},
   cutlass_kernel().tile(128, 128).cluster(2, 1).on(kStreamKSched).loop(kOverlap)},
  {kCoop2x1Epilogue, {"sm90_coop_128x128x128_c2x1_ovl_epi64x3", kUnboundedM,
      "K <= 4096 from M = 1024, and from M = 384 past one wave: 128x64 epilogue subtiles in 3 buffers, the next "
      "tile's first K block issued before the epilogue"},
   cutlass_kernel().tile(128, 128).cluster(2, 1).on(kCoop).loop(kOverlap).epilogue(64, 3).issues_ahead()},
  {kCoop2x1, {"sm90_coop_128x128x128_c2x1_ovl", kUnboundedM,
      "every other M: 128x128 cooperative tiles, our consumer loop, the 2x1 cluster multicasting each weight tile"},
   cutlass_kernel().tile(128, 128).cluster(2, 1).on(kCoop).loop(kOverlap)},
};
// clang-format on

static_assert(blockfp8::rows_in_id_order(kRows), "kRows must list the rows in RowId order");
static_assert(kRows[kNumRows - 1].info.max_m == kUnboundedM, "the last row takes every M");

// The index of the row named `name`, -1 if none (generated units find their row by name).
constexpr int row_index(const char* name) { return blockfp8::row_index(kRows, name); }

}  // namespace blockfp8::gemm::sm90
