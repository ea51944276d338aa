// Instantiates tile-table row sm90_swapab_128x64x128_ovl_slicek of sm90.cu: the 128x64 swap-AB row on our
// consumer loop (sm90_overlap_mainloop.cuh) with K slices: bf16 and fp16 out, CUTLASS split-K capable, and
// the fp32-output kernel its slices run on; see sm90_kernel.cuh. sm_90a only.
#include "sm90_kernel.cuh"

namespace blockfp8::gemm::sm90 {

using Row = Config<true, 128, 64, 1, 1, Schedule::kCooperativeStreamK, Consumer::kOverlap, true, true>;
template cudaError_t launch_config<Row>(const Problem&, cudaStream_t);
template size_t workspace_config<Row>(const Problem&);
template KPlan plan_config<Row>(const Problem&);

}  // namespace blockfp8::gemm::sm90
