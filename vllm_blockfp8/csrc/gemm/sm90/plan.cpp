// SM90 W8A8 GEMM planner: for one problem on one device, the whole plan (row, K split, tile order, tile width,
// launch mode), computed once per call; the kernels run it as given. Host logic only (sizes, sm_count, switches).
//
// How a shape gets its row, in one place:
//   1. The cost model (model()): every candidate kernel's grid on the problem: its tiles, the rounds (waves) its
//      persistent grid needs on the SMs, the bytes a CTA loads per K block, and the K plans the rules ask about.
//      Each SM's TMA ingress binds these kernels, so a kernel's time goes as rounds x bytes per CTA per K block
//      (Grid::cost()); K runs whole unless its split pays for itself (k_split(), k_slices()).
//   2. The ordered rules (choose()): the first that holds names the row, one line each with why. Lines marked
//      `cost` compare the model; the others are measured exceptions (bounds and ratios the model does not predict;
//      gemm/NOTES.md has the measurements).
//   3. The row's K plan, tile order and width (plan()), and the launch mode (options.cpp).
#include <algorithm>
#include <cstdint>
#include <limits>

#include "kernels/tok64.h"
#include "plan.h"

namespace blockfp8::gemm::sm90 {
namespace {

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ------------------------------------------------------------------------------------------------------------------
// The cost model
// ------------------------------------------------------------------------------------------------------------------

// One kernel's grid on a problem, tiles in the kernel's operand order (weights x tokens when swapped).
struct Grid {
  int64_t tiles_m = 0, tiles_n = 0;
  int64_t tiles = 0;                 // real tiles
  int64_t padded_m = 0, padded_n = 0;  // tiles per mode rounded up to whole clusters, as CUTLASS's schedulers count
  int64_t wave = 0;                  // CTAs in one wave: the SMs that whole clusters fill
  int64_t rounds = 0;                // waves of the padded tiles (0 without SMs)
  int64_t bytes = 0;                 // bytes a CTA loads per K block: (tile_m + tile_n) x 128 fp8 values
  int64_t cost() const { return rounds * bytes; }
  bool fills_one_wave(int64_t sms) const { return tiles >= 64 && tiles <= sms; }  // from 64 tiles (measured)
};

Grid grid(const Kernel& c, const Problem& p) {
  Grid g;
  g.tiles_m = cdiv(c.swap_ab ? p.n : p.m, c.tile_m);
  g.tiles_n = cdiv(c.swap_ab ? p.m : p.n, c.tile_n);
  g.tiles = g.tiles_m * g.tiles_n;
  g.padded_m = cdiv(g.tiles_m, c.cluster_m) * c.cluster_m;
  g.padded_n = cdiv(g.tiles_n, c.cluster_n) * c.cluster_n;
  const int64_t cluster = int64_t(c.cluster_m) * c.cluster_n;
  g.wave = p.sm_count / cluster * cluster;
  g.rounds = g.wave > 0 ? cdiv(g.padded_m * g.padded_n, g.wave) : 0;
  g.bytes = int64_t(c.tile_m + c.tile_n) * 128;
  return g;
}

// The 64-token-tile kernel (kernels/tok64.cu): a non-persistent grid of width-wide weight tiles.
Grid tok64_grid(const Problem& p, int width) {
  Grid g;
  g.tiles_m = cdiv(p.m, tok64::kTokenTile);
  g.tiles_n = cdiv(p.n, width);
  g.tiles = g.padded_m = g.tiles_m * g.tiles_n;
  g.padded_n = 1;
  g.wave = p.sm_count;
  g.rounds = cdiv(g.tiles, std::max(p.sm_count, 1));
  g.bytes = int64_t(tok64::kTokenTile + width) * 128;
  return g;
}

// The 64-token-tile width: the fewest rounds x bytes (cost); ties go to the wider tile (fewer CTAs read the token
// tile). BLOCKFP8_SM90_TILE_N replaces the rule.
int tok64_width(const Problem& p, int forced) {
  for (int w : tok64::kTileWidths)
    if (forced == w) return w;
  int best = tok64::kTileWidths[0];
  int64_t best_cost = std::numeric_limits<int64_t>::max();
  for (int w : tok64::kTileWidths) {
    const int64_t cost = tok64_grid(p, w).cost();
    if (cost <= best_cost) best = w, best_cost = cost;
  }
  return best;
}

// How a stream-K-scheduler row splits K. Stream-K and split-K pay a fixed cost (workspace memset, partial-tile
// fixup: 2-8 us; ~5-6 us a split), so they pay only where few tiles each walk a long K.
struct KSplit {
  bool stream_k = false;
  int splits = 1;
};
constexpr int64_t kStreamKMinKBlocks = 96;  // swap rows: stream-K where the tiles fill less than half the SMs
constexpr int64_t kSplitKMinKBlocks = 56;   // split-K rows: up to 3 CTAs a tile in the first wave (4 lost to 3)
constexpr int64_t kMaxSplits = 3;
constexpr int64_t kTailMaxFillPercent = 40;  // unswapped: stream-K for a last wave at most 40% full...
constexpr int64_t kTailMinKBlocks = 48;      // ...at K >= 48 blocks (short K: the fixup costs more than the tail)

// Unswapped rows: CUTLASS's stream-K where the last wave of the padded grid is thin (it then runs all but the last
// full wave data-parallel and spreads the rest over one wave of stream-K units).
bool streams_tail(const Grid& g, const Problem& p) {
  if (g.wave <= 0 || p.k / 128 < kTailMinKBlocks) return false;
  const int64_t tail = (g.padded_m * g.padded_n) % g.wave;
  return tail != 0 && tail * 100 <= g.wave * kTailMaxFillPercent;
}

KSplit k_split(const Kernel& c, const Grid& g, const Problem& p, int forced_splits) {
  KSplit d;
  const int64_t k_blocks = p.k / 128;
  if (!c.swap_ab) {
    d.stream_k = streams_tail(g, p);
  } else if (k_blocks >= kStreamKMinKBlocks && 2 * g.tiles < p.sm_count) {
    d.stream_k = true;
  } else if (c.split_k && g.tiles > 0) {
    const int64_t splits = forced_splits > 0              ? std::min(int64_t(forced_splits), k_blocks)
                           : k_blocks >= kSplitKMinKBlocks ? std::min(int64_t(p.sm_count) / g.tiles, kMaxSplits)
                                                           : 1;
    d.splits = splits >= 2 ? int(splits) : 1;
  }
  return d;
}

// K slices (slice_k rows): s batched slices of K into fp32 partials plus a sum kernel, the split without CUTLASS's
// fixup. s = the most slices <= min(SMs / tiles, 4) dividing the K blocks with >= 8 each; taken in place of
// CUTLASS's split-K, else where the blocks saved pay for the ~3.3 us fixed cost (about 16 blocks of one CTA's walk):
// sliced, a CTA walks kb / s blocks, unless the tiles x s CTAs then stream the weights faster than DRAM serves them
// (kDramTiles CTAs saturate the H200), so the walk lasts at least kb x tiles / kDramTiles blocks.
constexpr int64_t kSliceMinKBlocks = 8;
constexpr int64_t kMaxSlices = 4;
constexpr int64_t kSliceMinSavedBlocks = 16;
constexpr int64_t kDramTiles = 74;

int most_slices(int64_t k_blocks, int64_t at_most) {
  int64_t s = at_most;
  while (s >= 2 && (k_blocks % s != 0 || k_blocks / s < kSliceMinKBlocks)) --s;
  return s >= 2 ? int(s) : 1;
}

int k_slices(const Kernel& c, const Grid& g, const Problem& p, int forced_splits) {
  const int64_t k_blocks = p.k / 128;
  if (!c.slice_k || g.tiles <= 0) return 1;
  const KSplit d = k_split(c, g, p, forced_splits);
  if (d.stream_k) return 1;
  if (forced_splits > 0) return forced_splits >= 2 && k_blocks % forced_splits == 0 ? forced_splits : 1;
  const int s = most_slices(k_blocks, std::min(int64_t(p.sm_count) / g.tiles, kMaxSlices));
  if (s < 2 || d.splits > 1) return s;
  // Blocks saved, scaled by kDramTiles to stay in integers.
  const int64_t saved = k_blocks * kDramTiles - std::max(k_blocks * kDramTiles / s, k_blocks * g.tiles);
  return saved >= kSliceMinSavedBlocks * kDramTiles ? s : 1;
}

// What the rules compare, computed once per problem.
struct Model {
  int64_t m = 0, k = 0, sms = 0;
  Grid swap64x32, swap128x32, swap64x64, swap128x64, coop1x1, coop2x1;
  int tok64_width = 0;
  Grid tok64;               // at tok64_width
  KSplit swap128x64_split;  // the split-K 128x64 row's K plan
  int swap128x64_slices = 1;  // the K-slice 128x64 row's slices
  bool coop1x1_streams = false, coop2x1_streams = false;  // the `_sk` rows' stream-K rule
};

Model model(const Problem& p, const Options& o) {
  Model c;
  c.m = p.m, c.k = p.k, c.sms = p.sm_count;
  const auto of = [&](RowId r) { return grid(kRows[r].kernel, p); };
  c.swap64x32 = of(kSwap64x32Pp), c.swap128x32 = of(kSwap128x32), c.swap64x64 = of(kSwap64x64Pp);
  c.swap128x64 = of(kSwap128x64), c.coop1x1 = of(kCoop1x1StreamK), c.coop2x1 = of(kCoop2x1StreamK);
  c.tok64_width = tok64_width(p, o.tile_n);
  c.tok64 = tok64_grid(p, c.tok64_width);
  c.swap128x64_split = k_split(kRows[kSwap128x64].kernel, c.swap128x64, p, o.splits);
  c.swap128x64_slices = k_slices(kRows[kSwap128x64SliceK].kernel, of(kSwap128x64SliceK), p, o.splits);
  c.coop1x1_streams = streams_tail(c.coop1x1, p);
  c.coop2x1_streams = streams_tail(c.coop2x1, p);
  return c;
}

// ------------------------------------------------------------------------------------------------------------------
// The rules, in order: the first that holds names the row (times: GEMM-only on the H200, gemm/NOTES.md)
// ------------------------------------------------------------------------------------------------------------------

// Widths of the 64-token tiles at M = 65..128 that were measured: 32-96, and 144-192 where every other row needs
// two waves (N = 8449..12672); 16 and 112-128 lost or were not measured.
bool tok64_width_measured(int w) { return (w >= 32 && w <= 96) || (w >= 144 && w <= 192); }

// M = 112..128 where the 128x64 row's tiles need exactly two waves, the second at most 40% full.
bool thin_second_wave(const Model& c) {
  if (c.m < 112 || c.m > 128) return false;
  const int64_t second_wave = c.swap128x64.tiles - c.sms;
  return second_wave > 0 && 10 * second_wave <= 4 * c.sms;
}

RowId choose(const Model& c) {
  const int64_t m = c.m, sms = c.sms;
  const Grid &pp32 = c.swap64x32, &pp64 = c.swap64x64;
  // M <= 64: swap-AB tiles, tokens on the cheap wgmma N side; each CTA is K-block latency bound.
  if (m <= 64) {
    // 64-row tiles fill one wave: twice the 128x32 row's CTAs without splitting K. Past one wave a 64-row tile
    // takes about half the time: 3 waves against 2 won, 2 against 1 and 4 against 2 lost (measured).
    if (pp32.fills_one_wave(sms) || (pp32.tiles > sms && 2 * pp32.rounds <= 3 * c.swap128x32.rounds))
      return kSwap64x32Pp;
    // Fewer than 64 such tiles: the 128x32 row's K slices give more CTAs shorter walks; M <= 48: a 64-token tile
    // would be mostly padding (measured).
    if (m <= 48 || pp32.tiles < 64) return kSwap128x32;
    return kSwap64x64Pp;  // one 64-token tile a weight tile streams each weight block once, not twice
  }
  // M = 65..128: our 64-token tiles where one wave of them fits from 96 tiles at a measured width (cost: the width).
  if (m <= 128 && tok64_width_measured(c.tok64_width) && c.tok64.tiles >= 96 && c.tok64.tiles <= sms) return kTok64;
  if (m <= 256) {
    // Where the 128x64 row splits K, its split beat twice the tiles (measured): the 64-row tiles only at whole K.
    const bool whole_k = !c.swap128x64_split.stream_k && c.swap128x64_split.splits == 1;
    if (whole_k && (pp64.fills_one_wave(sms) || thin_second_wave(c))) return kSwap64x64Pp;
    if (c.swap128x64_slices > 1) return kSwap128x64SliceK;  // its slices save more than they cost (the model)
    // cost: no more rounds than the 128x128 row (M > 128); whole K on the persistent scheduler's smaller kernel.
    if (m <= 128 || c.swap128x64.rounds <= c.coop2x1.rounds)
      return whole_k ? kSwap128x64Persistent : kSwap128x64;
  }
  // M > 256, cost: one wave of 64-token tiles loading at most 3/4 of the 128x128 rows' rounds x bytes.
  const int64_t rounds_128 = std::min(c.coop1x1.rounds, c.coop2x1.rounds);
  if (m > 256 && c.tok64.tiles <= sms && 4 * c.tok64.cost() <= 3 * rounds_128 * c.coop2x1.bytes) return kTok64Narrow;
  // cost: the 2x1 cluster's padding tiles (odd token-tile counts) would cost a round.
  if (c.coop1x1.rounds < c.coop2x1.rounds) return kCoop1x1Epilogue;
  // Only the real tiles' last round is thin, past one round: stream-K without the cluster.
  if (c.coop1x1_streams && !c.coop2x1_streams && c.coop1x1.rounds > 1) return kCoop1x1StreamK;
  if (c.coop2x1_streams) return kCoop2x1StreamK;  // a thin last wave as stream-K
  // Short K, where the tile change is a large part of a tile's work (from M = 384 where a CTA changes tile at all).
  if (c.k <= 4096 && (m >= 1024 || (m >= 384 && c.coop2x1.rounds > 1))) return kCoop2x1Epilogue;
  return kCoop2x1;
}

// ------------------------------------------------------------------------------------------------------------------
// The narrow long-K plan: OFF by default (BLOCKFP8_SM90_NARROW_SPLIT=1 turns it on until an H200 run measures it).
// At N <= 1024 and K >= 4096 the rows above leave most SMs idle over a long K walk (DeepSeek-V3's 576x7168: 10
// 128x64 tiles at M = 128, 40 128x128 tiles at M = 1024). The plan then splits K over the idle SMs: up to 16 K
// slices on the K-slice swap rows at M <= 256 (128x32 to M = 64), stream-K over all tiles on the 1x1 `_sk` row
// above, where its tiles are fewer than the SMs.
// ------------------------------------------------------------------------------------------------------------------
constexpr int64_t kNarrowMaxN = 1024, kNarrowMinK = 4096, kNarrowMaxSlices = 16;

// The narrow plan's row and K split where it applies: a K-slice count, or stream-K; row -1 where it does not.
struct NarrowPlan {
  int row = -1;
  int slices = 1;
  bool stream_k = false;
};
NarrowPlan narrow_plan(const Problem& p) {
  NarrowPlan n;
  if (p.n > kNarrowMaxN || p.k < kNarrowMinK) return n;
  if (p.m <= 256) {
    const RowId row = p.m <= 64 ? kSwap128x32 : kSwap128x64SliceK;  // the K-slice rows of the swap tiles
    const Grid g = grid(kRows[row].kernel, p);
    const int s = g.tiles > 0 ? most_slices(p.k / 128, std::min(p.sm_count / g.tiles, kNarrowMaxSlices)) : 1;
    if (s >= 2) n.row = row, n.slices = s;
  } else if (grid(kRows[kCoop1x1StreamK].kernel, p).tiles < p.sm_count) {
    n.row = kCoop1x1StreamK, n.stream_k = true;
  }
  return n;
}

// ------------------------------------------------------------------------------------------------------------------
// The row's plan
// ------------------------------------------------------------------------------------------------------------------

// Persistent tile order: along M with swizzle up to 8 from M = 2048 (measured on the H200: 7168x16384 at M = 2048 /
// 4096 / 8192 took 0.81 / 0.93 / 0.79x CUTLASS's default order's time), CUTLASS's defaults below; the benchmark
// switches replace it at every M.
constexpr int64_t kSwizzledOrderMinM = 2048;
struct Order {
  int raster = 0;
  int max_swizzle = 1;
  bool fit = false;  // lower the swizzle until CUTLASS pads the tile grid no further than whole clusters
};
Order tile_order(const Problem& p, const Options& o) {
  if (o.order_from_env) return {o.raster, o.max_swizzle, false};
  const bool swizzled = p.m >= kSwizzledOrderMinM;
  return {swizzled ? 1 : 0, swizzled ? 8 : 1, swizzled};
}

// CUTLASS 4.2's PersistentTileSchedulerSm90Params::get_log_swizzle_size, which the kernels' scheduler applies to
// the swizzle it is given.
int cutlass_log_swizzle(int64_t tiles_m, int64_t tiles_n, int max_swizzle) {
  const int64_t least = std::min(tiles_m, tiles_n);
  if (max_swizzle >= 8 && least >= 6) return 3;
  if (max_swizzle >= 4 && least >= 3) return 2;
  if (max_swizzle >= 2 && least >= 2) return 1;
  return 0;
}

// The swizzle the launch hands CUTLASS (the one it then uses). CUTLASS rounds BOTH tile modes up to a multiple of
// swizzle x cluster and runs the padding tiles as work (swizzle 8 on a 2112-wide layer: 17 weight tiles -> 24), so
// where the order asks to fit, take the largest swizzle that pads nothing beyond whole clusters.
int launch_swizzle(const Kernel& c, const Grid& g, const Order& order) {
  const auto used = [&](int s) { return 1 << cutlass_log_swizzle(int(g.padded_m), int(g.padded_n), s); };
  if (!order.fit || g.padded_m <= 0 || g.padded_n <= 0) return used(std::max(order.max_swizzle, 1));
  for (int s = used(order.max_swizzle); s > 1; s /= 2) {
    if (g.padded_m % (int64_t(s) * c.cluster_m) == 0 && g.padded_n % (int64_t(s) * c.cluster_n) == 0) return s;
  }
  return 1;
}

// Row `row`'s K plan, tile order and width for p.
void fill_row_plan(const Problem& p, const Options& o, Plan& out) {
  const Kernel& c = kRows[out.row].kernel;
  if (c.kind == KernelKind::kTok64) {
    out.tile_n = tok64_width(p, o.tile_n);  // walks K whole, no persistent order
    return;
  }
  const Grid g = grid(c, p);
  const Order order = tile_order(p, o);
  out.raster = order.raster;
  out.swizzle = launch_swizzle(c, g, order);
  out.slices = k_slices(c, g, p, o.splits);
  if (c.schedule == Schedule::kCooperativeStreamK && out.slices == 1) {
    const KSplit d = k_split(c, g, p, o.splits);
    out.stream_k = d.stream_k;
    out.splits = d.splits;
  }
}

}  // namespace

Plan plan(const Problem& p, const Options& o, PdlMode mode, int forced_row) {
  Plan out;
  out.pdl = launch_mode(mode, p.k).pdl;
  out.nondeterministic_reduction = o.nondeterministic_reduction;
  if (forced_row >= kNumRows || forced_row < -1) return out;
  if (forced_row >= 0) {
    out.row = forced_row;  // the caller has checked rejects()
  } else {
    if (sm90::rejects(p) != nullptr) return out;
    out.row = choose(model(p, o));
  }
  // Sizes no kernel runs (m = 0 launches nothing): no K plan.
  if (p.m < 1 || p.n < 1 || p.k < 128 || p.sm_count <= 0) return out;
  const NarrowPlan narrow = forced_row < 0 && o.narrow_split ? narrow_plan(p) : NarrowPlan{};
  if (narrow.row >= 0) out.row = narrow.row;
  fill_row_plan(p, o, out);
  if (narrow.row >= 0) out.slices = narrow.slices, out.stream_k = narrow.stream_k, out.splits = 1;
  return out;
}

}  // namespace blockfp8::gemm::sm90

namespace blockfp8::gemm::sm90 {

// The arch API (../arch.h).

// What every row needs (the rows differ in speed only): the family contract, then what TMA asks. Pointers are
// checked for alignment only, so that shape-only queries (null pointers) are answered too; launch() refuses null
// pointers.
const char* rejects(const Problem& p) {
  if (const char* why = contract_rejects(p)) return why;
  // The TMA store of D needs 16-byte rows (and 16-byte columns of D^T in the swapped rows).
  if (p.n % 8 != 0) return "n must be a multiple of 8 (16-byte rows of the output for TMA)";
  if (p.a_scale_ld % 4 != 0) return "a_scale_ld must be a multiple of 4 (16-byte TMA columns of a_scale)";
  if (!aligned(p.a, 16) || !aligned(p.b, 16) || !aligned(p.d, 16) || !aligned(p.a_scale, 16))
    return "a, b, d and a_scale must be 16-byte aligned (TMA)";
  if (!aligned(p.b_scale, 4)) return "b_scale must be 4-byte aligned";
  return nullptr;
}

int num_rows() { return sm90::kNumRows; }
const TileRow& row(int i) { return sm90::kRows[i].info; }
Plan plan(const Problem& p, int forced_row) { return sm90::plan(p, sm90::options(), sm90::pdl_mode(), forced_row); }

}  // namespace blockfp8::gemm::sm90
