// Instantiates tile-table row sm90_coop_128x256x128_c1x1_rs of sm90.cu: unswapped 128x256 tiles without
// a cluster on the register-A consumer loop (sm90_register_a_mainloop.cuh): bf16 and fp16 out; see
// sm90_kernel.cuh. sm_90a only.
#include "sm90_kernel.cuh"

namespace blockfp8::gemm::sm90 {

using Row = Config<false, 128, 256, 1, 1, Schedule::kCooperative, Consumer::kRegisterA>;
template cudaError_t launch_config<Row>(const Problem&, cudaStream_t);
template size_t workspace_config<Row>(const Problem&);
template KPlan plan_config<Row>(const Problem&);

}  // namespace blockfp8::gemm::sm90
