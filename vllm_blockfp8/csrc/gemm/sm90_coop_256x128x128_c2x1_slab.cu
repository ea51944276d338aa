// Instantiates tile-table row sm90_coop_256x128x128_c2x1_slab of sm90.cu (bf16 and fp16 out): the 256x128
// cooperative tile (two consumer warpgroups of 128 rows = two m64 slabs each), cluster 2x1, with our
// slab-wise consumer loop (sm90_slab_mainloop.cuh); see sm90_kernel.cuh. One row per file so that the
// build compiles the rows in parallel. sm_90a only.
#include "sm90_kernel.cuh"

namespace blockfp8::gemm::sm90 {

using Row = Config<false, 256, 128, 2, 1, Schedule::kCooperative, Consumer::kSlab>;
template cudaError_t launch_config<Row>(const Problem&, cudaStream_t);
template size_t workspace_config<Row>(const Problem&);

}  // namespace blockfp8::gemm::sm90
