// SM90 W8A8 GEMM planner (plan.cpp) and its runtime options (options.cpp). Host logic only: no CUDA, no CUTLASS.
#pragma once

#include <cstdint>

#include "../arch.h"
#include "../gemm.h"
#include "table.h"

namespace blockfp8::gemm::sm90 {

// Benchmark switches (environment, read once per process; vllm_blockfp8/ops.py validates them at import):
//   BLOCKFP8_SM90_RASTER (heuristic | along_m | along_n), BLOCKFP8_SM90_SWIZZLE (1, 2, 4, 8): the persistent tile
//     order at every M in place of the planner's; setting either sets both (the other at CUTLASS's default).
//   BLOCKFP8_SM90_SPLITS (N >= 1): on the split-K capable swap rows, wherever they would not take stream-K, N K slices
//     where N divides the K blocks (the K-slice rows), else N CUTLASS split-K partial tiles (1: never split).
//   BLOCKFP8_SM90_REDUCTION (nondeterministic): split-K and stream-K partial tiles add in arrival order.
//   BLOCKFP8_SM90_TILE_N (16, 32, ..., 128, 144, 160, 192): the 64-token-tile rows' width in place of its rule.
//   BLOCKFP8_SM90_NARROW_SPLIT (1): turns on the narrow long-K K plan (plan.cpp, off by default until measured).
struct Options {
  bool order_from_env = false;
  int raster = 0;
  int max_swizzle = 1;
  int splits = 0;
  bool nondeterministic_reduction = false;
  int tile_n = 0;
  bool narrow_split = false;
};
using Getenv = const char* (*)(const char*);
Options parse_options(Getenv getenv);
const Options& options();  // this process's, parsed once

// BLOCKFP8_SM90_PDL (0 | 1 | gemm, default 1): 1 launches the GEMM (and its K-slice sum) with programmatic dependent
// launch where K <= 4096 and lets the quantizer trigger it at its start there; gemm launches them so at every K
// without the quantizer's trigger; 0, plain stream order. The same bits in every mode. Changeable after the first
// call (op set_sm90_pdl) so a benchmark can time the modes interleaved; a captured graph keeps its mode.
enum class PdlMode : int { kOff = 0, kQuantTriggers = 1, kGemmOnly = 2 };
int parse_pdl_mode(const char* name);  // a PdlMode, or -1 for an unknown name
const char* pdl_mode_name(PdlMode mode);
PdlMode pdl_mode();

struct LaunchMode {
  bool pdl = false;             // the GEMM launches programmatically
  bool quant_triggers = false;  // the quantizer before it triggers that launch at its start
};
LaunchMode launch_mode(PdlMode mode, int64_t k);

// The whole plan (gemm.h's plan() with this process's options and mode).
Plan plan(const Problem& p, const Options& o, PdlMode mode, int forced_row);

}  // namespace blockfp8::gemm::sm90
