// Instantiates tile-table row sm90_coop_128x128x128_c1x1_ovl_epi64x3 of sm90.cu (bf16 and fp16 out): the `_epi64x3`
// row (issue-ahead kernel, 128x64 epilogue subtiles in 3 buffers) without its 2x1 cluster, so no padding tile where
// the token tiles are odd in number; selected where that padding would cost the persistent grid a whole round. See
// sm90_kernel.cuh and sm90_issue_ahead_kernel.cuh. sm_90a only.
#include "sm90_kernel.cuh"

namespace blockfp8::gemm::sm90 {

using Row = Config<false, 128, 128, 1, 1, Schedule::kCooperative, Consumer::kOverlap, false, false, 64, 3, true>;
template cudaError_t launch_config<Row>(const Problem&, cudaStream_t);
template size_t workspace_config<Row>(const Problem&);
template KPlan plan_config<Row>(const Problem&);

}  // namespace blockfp8::gemm::sm90
