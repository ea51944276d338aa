// Instantiates tile-table row sm90_coop_128x128x128_c1x1_ovl_sk of sm90.cu (bf16 and fp16 out): the `_sk` row (our
// overlap loop on CUTLASS's stream-K scheduler) without its 2x1 cluster, so an odd number of token tiles runs no
// padding tile and stream-K splits only the real tiles' tail; see sm90_kernel.cuh. sm_90a only.
#include "sm90_kernel.cuh"

namespace blockfp8::gemm::sm90 {

using Row = Config<false, 128, 128, 1, 1, Schedule::kCooperativeStreamK, Consumer::kOverlap>;
template cudaError_t launch_config<Row>(const Problem&, cudaStream_t);
template size_t workspace_config<Row>(const Problem&);
template KPlan plan_config<Row>(const Problem&);

}  // namespace blockfp8::gemm::sm90
