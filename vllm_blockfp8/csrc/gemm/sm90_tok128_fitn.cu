// Tile-table row sm90_tok128_fitn of sm90.cu (a forced-only candidate): the token-tile kernel (sm90_tok_kernel.cuh) on
// 128-token tiles with two math warpgroups that share each weight tile, bf16 and fp16 out, every width in sm90_tok.h's
// tok128::kTileWidths, the width picked per problem so that the tiles fill about one wave. sm_90a only.
#include "sm90_tok_kernel.cuh"

namespace blockfp8::gemm::sm90::tok128 {

int64_t tile_count(const Problem& p, int width) { return tok::tile_count(p, kTokenTile, width); }

int tile_n(const Problem& p) { return tok::pick_width(p, kTokenTile, kTileWidths); }

cudaError_t launch(const Problem& p, cudaStream_t stream) {
  switch (tile_n(p)) {
    case 32: return tok::launch_out<2, 32>(p, stream);
    case 48: return tok::launch_out<2, 48>(p, stream);
    case 64: return tok::launch_out<2, 64>(p, stream);
    case 80: return tok::launch_out<2, 80>(p, stream);
    case 96: return tok::launch_out<2, 96>(p, stream);
    case 112: return tok::launch_out<2, 112>(p, stream);
    case 128: return tok::launch_out<2, 128>(p, stream);
    case 144: return tok::launch_out<2, 144>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

size_t workspace(const Problem&) { return 0; }

KPlan plan(const Problem& p) {
  KPlan out;
  out.tile_n = tile_n(p);
  return out;
}

}  // namespace blockfp8::gemm::sm90::tok128
