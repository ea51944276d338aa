// Instantiates tile-table row sm90_swapab_64x64x128_pp_ovl of sm90.cu (bf16 and fp16 out): swap-AB with
// 64-row weight tiles x 64 tokens on CUTLASS's ping-pong blockwise-FP8 kernel, with our overlapped consumer loop
// (sm90_overlap_mainloop.cuh) in place of CUTLASS's; see sm90_kernel.cuh. sm_90a only.
#include "sm90_kernel.cuh"

namespace blockfp8::gemm::sm90 {

using Row = Config<true, 64, 64, 1, 1, Schedule::kPingpong, Consumer::kOverlap>;
template cudaError_t launch_config<Row>(const Problem&, cudaStream_t);
template size_t workspace_config<Row>(const Problem&);
template KPlan plan_config<Row>(const Problem&);

}  // namespace blockfp8::gemm::sm90
