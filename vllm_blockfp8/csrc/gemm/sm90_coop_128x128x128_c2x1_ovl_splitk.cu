// Instantiates tile-table row sm90_coop_128x128x128_c2x1_ovl_splitk of sm90.cu (bf16 and fp16 out): the
// row sm90_coop_128x128x128_c2x1_ovl plus its stream-K-scheduler twin, which runs the problems where
// the tiles fill at most half the SMs (split-K) or stream-K's rule fires (Config::kSplitK, rule in
// sm90_kernel.cuh); see sm90_kernel.cuh. Two kernels per output type in this unit. sm_90a only.
#include "sm90_kernel.cuh"

namespace blockfp8::gemm::sm90 {

using Row = Config<false, 128, 128, 2, 1, Schedule::kCooperative, Consumer::kOverlap, true>;
template cudaError_t launch_config<Row>(const Problem&, cudaStream_t);
template size_t workspace_config<Row>(const Problem&);

}  // namespace blockfp8::gemm::sm90
