// Instantiates tile-table row sm90_coop_128x56x128_ovl of sm90.cu (bf16 and fp16 out), a forced-only
// candidate: unswapped 128 (tokens) x 56 (weight columns) tiles, so that more layers' tile counts
// can match the SM count at M <= 128 (as DeepGEMM picks its tile width); a tile's columns lie in one
// or two 128-column weight blocks, whose scales our consumer loop reads itself (narrow weight tiles,
// sm90_overlap_mainloop.cuh). sm_90a only.
// A 56-wide wgmma per K slice (CUTE's extended shapes; without them the tile splits into narrower
// wgmmas: the static_assert in NarrowWeightTiles). Only the selection of the tiled MMA differs, and
// only for tile widths the other units do not use.
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#include "sm90_kernel.cuh"

namespace blockfp8::gemm::sm90 {

using Row = Config<false, 128, 56, 1, 1, Schedule::kCooperative, Consumer::kOverlap>;
template cudaError_t launch_config<Row>(const Problem&, cudaStream_t);
template size_t workspace_config<Row>(const Problem&);
template KPlan plan_config<Row>(const Problem&);

}  // namespace blockfp8::gemm::sm90
