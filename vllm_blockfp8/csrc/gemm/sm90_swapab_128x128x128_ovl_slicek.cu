// Instantiates tile-table row sm90_swapab_128x128x128_ovl_slicek of sm90.cu: 128 weight rows x 128 tokens,
// swap-AB, on our overlap consumer loop with the column scales read from shared memory during the promotion
// (sm90_overlap_mainloop.cuh, kScalesFromSmem), with K slices: bf16 and fp16 out, CUTLASS split-K capable, and
// the fp32-output kernel its slices run on; see sm90_kernel.cuh. sm_90a only.
#include "sm90_kernel.cuh"

namespace blockfp8::gemm::sm90 {

using Row = Config<true, 128, 128, 1, 1, Schedule::kCooperativeStreamK, Consumer::kOverlap, true, true>;
template cudaError_t launch_config<Row>(const Problem&, cudaStream_t);
template size_t workspace_config<Row>(const Problem&);
template KPlan plan_config<Row>(const Problem&);

}  // namespace blockfp8::gemm::sm90
