// Instantiates tile-table row sm90_swapab_128x64x128_ovl_splitk of sm90.cu (bf16 and fp16 out): the swap-AB row
// sm90_swapab_128x64x128_ovl with split-K where its tiles fill under half the SMs
// (Config::kSplitK, rule in sm90_kernel.cuh); see sm90_kernel.cuh.
// One row per file so that the build compiles the rows in parallel. sm_90a only.
#include "sm90_kernel.cuh"

namespace blockfp8::gemm::sm90 {

using Row = Config<true, 128, 64, 1, 1, Schedule::kCooperativeStreamK, Consumer::kOverlap, true>;
template cudaError_t launch_config<Row>(const Problem&, cudaStream_t);
template size_t workspace_config<Row>(const Problem&);

}  // namespace blockfp8::gemm::sm90
