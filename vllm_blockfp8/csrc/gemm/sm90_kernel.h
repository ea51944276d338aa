// SM90 block-FP8 GEMM: the kernel configuration type and the two entry points per configuration.
// Light on purpose (no CUTLASS): sm90.cu's tile table names configurations through this header,
// and each sm90_<row>.cu explicitly instantiates the entry points of one configuration from
// sm90_kernel.cuh. A row whose configuration no file instantiates fails to link, so the table and
// the built kernels cannot drift apart.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "gemm.h"

namespace blockfp8::gemm::sm90 {

enum class Schedule {
  kCooperativeStreamK,  // stream-K capable scheduler; data-parallel or stream-K picked per problem
  kCooperative,         // data-parallel persistent scheduler; no workspace, less scheduling overhead
  kPingpong,            // persistent, each consumer warpgroup on its own tile (64 rows of the kernel's
                        // M); swap-AB rows only, where that lets weight tiles be 64 rows tall
};

// Which consumer loop (the math warpgroups' side of the mainloop) a row runs on CUTLASS's
// blockwise-FP8 collective; producer, pipeline, shared storage, scheduler and epilogue are
// CUTLASS's in every case.
enum class Consumer {
  kCutlass,  // CUTLASS's own: each K block's wgmma drained (wait<0>), then promoted
  kOverlap,  // sm90_overlap_mainloop.cuh: block k-1 promoted under block k's wgmma (one atom of
             // M per warpgroup; unswapped and swap-AB rows)
};

// kSwapAB: the kernel computes D^T = B * A^T, so the weight rows (n) fill the 128-row wgmma M side
// and the tokens (m) sit on the narrow wgmma N side; D^T is stored column-major, i.e. D row-major.
// kTileM / kTileN are the kernel's CTA tile in ITS operand order (weights x tokens when swapped).
// Both schedules run two consumer warpgroups on one tile (CUTLASS's cooperative FP8 blockwise
// kernel): one warpgroup's promotion FMAs overlap the other's wgmma.
// kConsumer: the consumer loop (above); defaulted so that the rows that do not ask for one of ours
// keep CUTLASS's mainloop unchanged.
// kSplitK: where the row's tiles fill at most half the GPU and K is long, split each tile's K over
// up to 3 CTAs (CUTLASS's split-K decomposition of the stream-K scheduler; the rule is in
// sm90_kernel.cuh). A runtime argument of the kernel, so kCooperativeStreamK rows only.
// kSliceK (swap rows): where the tiles leave SMs idle and slicing saves more than it costs, run K
// slices as a batched GEMM into fp32 partials and sum them in a second kernel (the rule is in
// sm90_kernel.cuh); adds an fp32-output instantiation of the row's kernel. Replaces kSplitK's
// split wherever a slice count divides the K blocks.
// kEpilogueN (unswapped cooperative rows): the width of the epilogue's subtile (128 rows x kEpilogueN
// columns through shared memory, one TMA store each); 0 = CUTLASS's choice (128x32: four a 128-wide tile in
// two buffers, so the third and fourth wait for the store before last to leave shared memory).
// kStoreStages: subtile buffers (0 = CUTLASS's choice, min(subtiles, 2)); more buffers mean fewer waits on
// stores and, out of the same shared memory, fewer mainloop stages (gemm/NOTES.md seventeenth session).
// kIssueAhead (cooperative rows with our overlap loop): the math warpgroups issue the next tile's first K block
// before the current tile's epilogue (sm90_issue_ahead_kernel.cuh; gemm/NOTES.md twenty-seventh session).
template <bool kSwapAB_, int kTileM_, int kTileN_, int kClusterM_, int kClusterN_, Schedule kSchedule_,
          Consumer kConsumer_ = Consumer::kCutlass, bool kSplitK_ = false, bool kSliceK_ = false,
          int kEpilogueN_ = 0, int kStoreStages_ = 0, bool kIssueAhead_ = false>
struct Config {
  static constexpr bool kSwapAB = kSwapAB_;
  static constexpr int kTileM = kTileM_;
  static constexpr int kTileN = kTileN_;
  static constexpr int kTileK = 128;  // one K scale block per pipeline stage
  static constexpr int kClusterM = kClusterM_;
  static constexpr int kClusterN = kClusterN_;
  static constexpr Schedule kSchedule = kSchedule_;
  static constexpr Consumer kConsumer = kConsumer_;
  static constexpr bool kSplitK = kSplitK_;
  static constexpr bool kSliceK = kSliceK_;
  static constexpr int kEpilogueN = kEpilogueN_;
  static constexpr int kStoreStages = kStoreStages_;
  static constexpr bool kIssueAhead = kIssueAhead_;
  static_assert(!kSliceK || kSwapAB, "K slices are written for the swap-AB operand order");
  static_assert(!kSplitK || kSchedule == Schedule::kCooperativeStreamK, "only the stream-K scheduler splits K");
  static_assert(kSchedule != Schedule::kPingpong || (kSwapAB && kTileM == 64),
                "ping-pong rows: swap-AB, 64-row weight tiles");
  static_assert(kSchedule == Schedule::kPingpong || kTileM % 128 == 0,
                "cooperative rows split the tile's M over two warpgroups of 64 and scale blocks of 128");
  static_assert((kEpilogueN == 0 && kStoreStages == 0) ||
                    (kEpilogueN > 0 && !kSwapAB && kSchedule != Schedule::kPingpong && kTileN % kEpilogueN == 0 &&
                     kEpilogueN % 16 == 0),
                "epilogue subtiles: unswapped cooperative rows, a width dividing the tile");
  static_assert(!kIssueAhead || (kSchedule == Schedule::kCooperative && kConsumer == Consumer::kOverlap),
                "issue-ahead: the persistent cooperative kernel with our overlap consumer loop");
};

// Tile counts of a configuration's grid (host logic shared by sm90.cu's selection preconditions and
// sm90_kernel.cuh's K plans and tile order). Tiles of the kernel's M and N modes (weights x tokens
// when swapped):
template <class Cfg>
int64_t tiles_m(const Problem& p) {
  return ((Cfg::kSwapAB ? p.n : p.m) + Cfg::kTileM - 1) / Cfg::kTileM;
}
template <class Cfg>
int64_t tiles_n(const Problem& p) {
  return ((Cfg::kSwapAB ? p.m : p.n) + Cfg::kTileN - 1) / Cfg::kTileN;
}
template <class Cfg>
int64_t tile_count(const Problem& p) {
  return tiles_m<Cfg>(p) * tiles_n<Cfg>(p);
}
// Tiles of each mode rounded up to whole clusters, as CUTLASS's schedulers count them.
template <class Cfg>
int64_t cluster_tiles_m(const Problem& p) {
  return (tiles_m<Cfg>(p) + Cfg::kClusterM - 1) / Cfg::kClusterM * Cfg::kClusterM;
}
template <class Cfg>
int64_t cluster_tiles_n(const Problem& p) {
  return (tiles_n<Cfg>(p) + Cfg::kClusterN - 1) / Cfg::kClusterN * Cfg::kClusterN;
}
// Tiles the scheduler hands out (padding tiles of partial clusters included).
template <class Cfg>
int64_t cluster_tile_count(const Problem& p) {
  return cluster_tiles_m<Cfg>(p) * cluster_tiles_n<Cfg>(p);
}
// CTAs in one wave of the persistent grid: the SMs that whole clusters fill.
template <class Cfg>
int64_t cluster_wave(const Problem& p) {
  const int64_t cluster = int64_t(Cfg::kClusterM) * Cfg::kClusterN;
  return p.sm_count / cluster * cluster;
}
// Waves of that grid (0 without SMs).
template <class Cfg>
int64_t waves(const Problem& p) {
  const int64_t wave = cluster_wave<Cfg>(p);
  return wave > 0 ? (cluster_tile_count<Cfg>(p) + wave - 1) / wave : 0;
}

// Defined in sm90_kernel.cuh; instantiated once per configuration in its sm90_<row>.cu file
// (the K plan is host logic, but its rules live beside the kernel they drive).
template <class Cfg>
cudaError_t launch_config(const Problem& p, cudaStream_t stream);

template <class Cfg>
size_t workspace_config(const Problem& p);

template <class Cfg>
KPlan plan_config(const Problem& p);

}  // namespace blockfp8::gemm::sm90
