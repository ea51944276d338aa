// Instantiates tile-table row sm90_swapab_128x64x128_c1x2_ovl of sm90.cu (bf16 and fp16 out, split-K capable): the
// 128x64 swap-AB row in 1x2 clusters, i.e. the two CTAs of a cluster take neighbouring 64-token tiles of one weight
// tile, which TMA multicasts to both; see sm90_kernel.cuh. Candidate, forced only (gemm/NOTES.md, fourteenth session).
// One row per file so that the build compiles the rows in parallel. sm_90a only.
#include "sm90_kernel.cuh"

namespace blockfp8::gemm::sm90 {

using Row = Config<true, 128, 64, 1, 2, Schedule::kCooperativeStreamK, Consumer::kOverlap, true>;
template cudaError_t launch_config<Row>(const Problem&, cudaStream_t);
template size_t workspace_config<Row>(const Problem&);
template KPlan plan_config<Row>(const Problem&);

}  // namespace blockfp8::gemm::sm90
