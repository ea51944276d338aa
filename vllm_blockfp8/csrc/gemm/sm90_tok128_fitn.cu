// Instantiates tile-table row sm90_tok128_fitn of sm90.cu (a forced-only candidate): the token-tile kernel
// (sm90_tok_kernel.cuh) on 128-token tiles with two math warpgroups sharing each weight tile, bf16 and fp16 out, every
// width in sm90_tok.h's Widths<2>, the width picked per problem so that the tiles fill about one wave. sm_90a only.
#include "sm90_tok_kernel.cuh"

namespace blockfp8::gemm::sm90::tok {

template int tile_n<2>(const Problem&);
template int64_t tile_count<2>(const Problem&, int);
template cudaError_t launch<2>(const Problem&, cudaStream_t);
template KPlan plan<2>(const Problem&);

}  // namespace blockfp8::gemm::sm90::tok
