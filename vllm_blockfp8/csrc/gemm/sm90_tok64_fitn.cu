// Tile-table row sm90_tok64_fitn of sm90.cu: the token-tile kernel (sm90_tok_kernel.cuh) on 64-token tiles with one
// math warpgroup, bf16 and fp16 out, every width in sm90_tok.h's tok64::kTileWidths, the width picked per problem so
// that the tiles fill about one wave. sm_90a only.
#include "sm90_tok_kernel.cuh"

namespace blockfp8::gemm::sm90::tok64 {

// The kernel with diagnostic bits, for tools/tok64_split_probe.cu (the extension instantiates kProbe = 0 only).
template <int TileN, class Out, int kProbe = 0>
cudaError_t launch_width(const Problem& p, cudaStream_t stream) {
  return tok::launch_width<1, TileN, Out, kProbe>(p, stream);
}
namespace probe = tok::probe;

int64_t tile_count(const Problem& p, int width) { return tok::tile_count(p, kTokenTile, width); }

int tile_n(const Problem& p) { return tok::pick_width(p, kTokenTile, kTileWidths); }

cudaError_t launch(const Problem& p, cudaStream_t stream) {
  switch (tile_n(p)) {
    case 16: return tok::launch_out<1, 16>(p, stream);
    case 32: return tok::launch_out<1, 32>(p, stream);
    case 48: return tok::launch_out<1, 48>(p, stream);
    case 64: return tok::launch_out<1, 64>(p, stream);
    case 80: return tok::launch_out<1, 80>(p, stream);
    case 96: return tok::launch_out<1, 96>(p, stream);
    case 112: return tok::launch_out<1, 112>(p, stream);
    case 128: return tok::launch_out<1, 128>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

size_t workspace(const Problem&) { return 0; }

KPlan plan(const Problem& p) {
  KPlan out;
  out.tile_n = tile_n(p);
  return out;
}

}  // namespace blockfp8::gemm::sm90::tok64
