// Instantiates tile-table row sm90_tok64_fitn of sm90.cu: the token-tile kernel (sm90_tok_kernel.cuh) on 64-token tiles
// with one math warpgroup, bf16 and fp16 out, every width in sm90_tok.h's Widths<1>, the width picked per problem so
// that the tiles fill about one wave. sm_90a only.
#include "sm90_tok_kernel.cuh"

namespace blockfp8::gemm::sm90::tok {

template int tile_n<1>(const Problem&);
template int64_t tile_count<1>(const Problem&, int);
template cudaError_t launch<1>(const Problem&, cudaStream_t);
template KPlan plan<1>(const Problem&);

}  // namespace blockfp8::gemm::sm90::tok
