// SM90 block-FP8 GEMM: a CUTLASS row's kernel configuration as a type, and its two entry points.
// Light on purpose (no CUTLASS): RowConfig<i> is built from table.h's named fields of row i; each generated unit
// (setup.py) explicitly instantiates the entry points of one row from cutlass_gemm.cuh, and dispatch.cpp takes their
// addresses. A row that no unit instantiates fails to link, so the table and the built kernels cannot drift apart.
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

#include "../../gemm.h"
#include "../table.h"

namespace blockfp8::gemm::sm90 {

// The kernel's template parameters (cutlass_gemm.cuh reads them), in the operand order of the kernel (weights x
// tokens when swapped). The field meanings are table.h's; the asserts state what the kernels support.
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

// Row i's Config, from its named fields.
template <int I>
using RowConfig = Config<kRows[I].kernel.swap_ab, kRows[I].kernel.tile_m, kRows[I].kernel.tile_n,
                         kRows[I].kernel.cluster_m, kRows[I].kernel.cluster_n, kRows[I].kernel.schedule,
                         kRows[I].kernel.consumer, kRows[I].kernel.split_k, kRows[I].kernel.slice_k,
                         kRows[I].kernel.epilogue_n, kRows[I].kernel.store_stages, kRows[I].kernel.issue_ahead>;

// Defined in cutlass_gemm.cuh, instantiated once per row in its generated unit. They run the plan as given
// (plan.cpp decided the K split, the tile order and the launch mode).
template <class Cfg>
cudaError_t launch_config(const Problem& p, const Plan& plan, cudaStream_t stream);

template <class Cfg>
size_t workspace_config(const Problem& p, const Plan& plan);

}  // namespace blockfp8::gemm::sm90
