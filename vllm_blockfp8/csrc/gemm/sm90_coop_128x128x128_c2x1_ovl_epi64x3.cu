// Instantiates tile-table row sm90_coop_128x128x128_c2x1_ovl_epi64x3 of sm90.cu (bf16 and fp16 out): the 128x128 row
// with 128x64 epilogue subtiles in 3 buffers on the issue-ahead kernel (selected at K <= 4096 from M = 1024); see
// sm90_kernel.cuh and sm90_issue_ahead_kernel.cuh. sm_90a only.
#include "sm90_kernel.cuh"

namespace blockfp8::gemm::sm90 {

using Row = Config<false, 128, 128, 2, 1, Schedule::kCooperative, Consumer::kOverlap, false, false, 64, 3, true>;
template cudaError_t launch_config<Row>(const Problem&, cudaStream_t);
template size_t workspace_config<Row>(const Problem&);
template KPlan plan_config<Row>(const Problem&);

}  // namespace blockfp8::gemm::sm90
