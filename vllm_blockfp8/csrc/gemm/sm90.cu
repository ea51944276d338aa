// SM90 (sm_90a only) W8A8 block-scaled FP8 GEMM: the tile table, row checks and dispatch.
//
//   D[m, n] = sum_kb (A[m, kb-block] . B[n, kb-block]) * SFA[m, kb] * SFB[n / 128, kb]
//   A fp8 [m, k] K-major, SFA fp32 per token per 128 K (M-major, ld % 4 == 0), B fp8 [n, k]
//   K-major, SFB fp32 [ceil(n/128), k/128] row-major, D bf16/fp16 [m, n] row-major.
//
// Kernels: CUTLASS cooperative (for 64-row weight tiles: ping-pong) TMA/wgmma mainloop with blockwise
// scaling (sm90_kernel.cuh); each row's two instantiations (bf16 and fp16 out) live in sm90_<row name>.cu,
// one file per row of the table below (the `_ovl` rows run our own consumer loop on that collective:
// sm90_overlap_mainloop.cuh); the `sm90_tok64_fitn` row is a kernel of our own (sm90_tok64_fitn.cu:
// 64-token tiles, a weight-tile width per problem). A row may carry a selection precondition (mostly the
// 64-row rows: their tiles fill one wave, or at M = 112..128 the 128x64 row leaves a thin second wave, below 96
// SMs; the tok64 row: 96 tiles up to one wave, 32-96 wide (144-192 where no other row fits one wave), M = 65..128;
// the 128x32 row above M = 48: few 64-row tiles;
// the `_slicek` row: its slices fire; the 128x64 rows above M = 128: no more waves than the 128x128 row; the
// `_persistent` 128x64 row: the plain one would run K whole;
// the `_tok64_fitn_narrow` row (the tok64 kernel above M = 256): one wave of its tiles loads 3/4 of the 128x128 rows'
// bytes or less;
// the `_c1x1_ovl_epi64x3` row: the 2x1 rows' padding tiles (odd token-tile counts) would cost a round;
// the `_c1x1_ovl_sk` row: the stream-K rule fires on the real tiles only (padding tiles again), past one round;
// the `_c2x1_ovl_sk` row: its stream-K rule fires;
// the `_epi64x3` row, the 128x128 row with wider epilogue subtiles and the next tile's first K block issued before
// the epilogue (sm90_issue_ahead_kernel.cuh): K <= 4096 from M = 1024,
// and from M = 384 where its tiles exceed one wave);
// forcing a row ignores it. Where their tiles leave SMs idle the cooperative swap rows
// split K: the 128x32 row and the 128x64 `_slicek` row into K slices run as one batched launch plus a sum kernel
// (where that saves more than it costs), else, like the plain 128x64 row, CUTLASS's split-K at K >= 7168.
// The 128x128 `_sk` rows run a nearly empty last wave as stream-K.
// Unsupported (rejected with a reason): k % 128 != 0, n % 8 != 0, misaligned pointers, sizes past
// int32, bias (not implemented yet).
#include <algorithm>
#include <cstdint>
#include <limits>

#include "gemm.h"
#include "sm90_kernel.h"
#include "sm90_tok64.h"

namespace blockfp8::gemm {
namespace {

using sm90::Config;
using sm90::Consumer;
using sm90::Schedule;

struct Sm90Row {
  TileRow info;
  cudaError_t (*launch)(const Problem&, cudaStream_t);
  size_t (*workspace)(const Problem&);
  KPlan (*plan)(const Problem&);
  // Selection precondition (speed, not capability: a forced row runs without it); nullptr = any.
  bool (*prefers)(const Problem&) = nullptr;
};

template <class Cfg>
constexpr Sm90Row make_row(const char* name, int64_t max_m, const char* reason,
                           bool (*prefers)(const Problem&) = nullptr) {
  return {{name, max_m, reason}, &sm90::launch_config<Cfg>, &sm90::workspace_config<Cfg>, &sm90::plan_config<Cfg>,
          prefers};
}

using sm90::tile_count;
using sm90::waves;

constexpr Sm90Row make_tok64_row(const char* name, int64_t max_m, const char* reason,
                                 bool (*prefers)(const Problem&) = nullptr) {
  return {{name, max_m, reason}, &sm90::tok64::launch, &sm90::tok64::workspace, &sm90::tok64::plan, prefers};
}

constexpr int64_t kSmallRowsMaxM = 64;  // the 64x32 and 128x32 rows' bound

// The 64-row ping-pong rows' tiles fill one wave, from 64 tiles up.
constexpr int64_t kOneWaveMinTiles = 64;
template <class Cfg>
bool fills_one_wave(const Problem& p) {
  const int64_t tiles = tile_count<Cfg>(p);
  return tiles >= kOneWaveMinTiles && tiles <= p.sm_count;
}

// Selection precondition of the 64x32 ping-pong row: its tiles fill one wave, or, past one wave, need
// 3 waves where the 128x32 row's need 2 (2 x waves <= 3 x waves; with twice that row's tiles, only 3
// against 2 meets it past one wave). Below 64 tiles, the 128-row row's K slices (4 of them on <= 24
// of its tiles) gave more CTAs shorter walks (seventh session). Past one wave its per-tile time is
// about half the 128x32 row's, so the waves decide: 3 against 2 took 0.79-0.92x the 128x32 row's
// time at 35 fitted points and 0.875-0.938x (geomean 0.908) at 17 held-out ones, also ahead of the
// 64x64 row at M = 49..64; 2 against 1 lost (0.96-1.12x), and 400 tiles (three waves plus 4: 4
// against 2) lost up to 1.046x (gemm/NOTES.md tenth and eleventh sessions).
using Sm90Pingpong64x32 = Config<true, 64, 32, 1, 1, Schedule::kPingpong, Consumer::kOverlap>;
using Sm90Swap128x32 = Config<true, 128, 32, 1, 1, Schedule::kCooperativeStreamK, Consumer::kCutlass, true, true>;
bool prefers_64x32(const Problem& p) {
  return fills_one_wave<Sm90Pingpong64x32>(p) ||
         (tile_count<Sm90Pingpong64x32>(p) > p.sm_count &&
          2 * waves<Sm90Pingpong64x32>(p) <= 3 * waves<Sm90Swap128x32>(p));
}

// Selection precondition of the 128x32 row: M <= 48; above (M = 49..64) only where the 64x32 row's
// tiles are fewer than one wave's worth (its K slices); where they exceed one wave the 64x64 row
// below, one 64-token tile per weight tile, streams each weight block once instead of twice:
// 0.83-0.95x this row's time at 27 held-out points (gemm/NOTES.md tenth session). At M = 33..48 the
// 64-token tile is mostly padding, and it lost at 3 of 10 held-out points at M = 40 (up to 1.032x).
constexpr int64_t kTwoTokenTilesFrom = 48;
bool keeps_128x32(const Problem& p) {
  return p.m <= kTwoTokenTilesFrom || tile_count<Sm90Pingpong64x32>(p) < kOneWaveMinTiles;
}

// Selection precondition of the 64-token-tile row (sm90_tok64_fitn.cu; M in (64, 128]): its tiles, at the
// width its rule picks, fit one wave and are 32 to 96 wide. There it took 0.83-1.13x the selected row's time
// (geomean 0.948, slower than 1.03x at 3 of 46 points) on held-out sets 1-3 at M = 96 / 128 and 0.83-1.00x
// (geomean 0.929) at the benchmark set's 16 such points. Past one wave it lost (1.06-1.53x at M = 96), 112-128
// wide at one wave it was 1.03-1.13x on the benchmark set, and at M <= 64, against the swap rows' 32- and
// 64-token tiles, 0.89-1.39x (gemm/NOTES.md fifteenth and sixteenth sessions, E9).
// Outside what was measured there (fewer than 96 tiles, or 16 wide) the rows after it keep the problem.
// Past 128 wide (N = 8449..12672 at two token tiles, where every other row needs two waves): 144, 160 and 192.
// E22b: 0.66-0.98x the selected row's time (geomean 0.779) at 26 fresh held-out points of 7 layers at M = 72..120,
// 192 then only below M = 112, where E20b's 64x64 row beat it (1.02-1.10x); after E24 (the 192-wide loop 0.73x) also
// at M = 112..128 (E22c): 0.82-1.02x (geomean 0.888) at 21 fit points, 0.81-0.94x (geomean 0.868) at 15 held-out
// ones (gemm/NOTES.md twenty-third and twenty-fourth sessions).
constexpr int64_t kTok64MaxM = 128;
constexpr int kTok64MinWidth = 32, kTok64MaxWidth = 96;
constexpr int kTok64WideMinWidth = 144, kTok64WideMaxWidth = 192;
constexpr int64_t kTok64MinTiles = 96;
bool prefers_tok64(const Problem& p) {
  if (p.m <= kSmallRowsMaxM) return false;
  const int width = sm90::tok64::tile_n(p);
  const int64_t tiles = sm90::tok64::tile_count(p, width);
  const bool measured_width = (width >= kTok64MinWidth && width <= kTok64MaxWidth) ||
                              (width >= kTok64WideMinWidth && width <= kTok64WideMaxWidth);
  return measured_width && tiles >= kTok64MinTiles && tiles <= p.sm_count;
}

// Selection precondition of the 64x64 ping-pong row (M in (64, 256]): only where the 128x64 row would run
// each tile's K whole (where that row splits K, CUTLASS split-K or stream-K on long K, the split beat twice
// the tiles: gemm/NOTES.md seventh session, 20 points), and there either
// - its 64-row tiles fill one wave, or
// - M = 112..128 and the 128x64 row's tiles need exactly two waves, the second at most 40% full (N = 8449..11776
//   on 132 SMs): the finer tiles waste less of the thin second wave. 0.897-0.930x the 128x64 row's time at all
//   20 such points of the fit and the first held-out set, 0.90-0.92x (geomean 0.911) at 15 fresh held-out ones
//   (gemm/NOTES.md twenty-first and twenty-second sessions, E20b). At M = 100 it lost (1.01-1.05x), at M = 104-108
//   it took ~0.95x, and with three or more waves ~0.99x: none of those is taken. Since E22c the tok64 row, listed
//   above, takes all these problems on GPUs of 96 SMs or more (one wave of 144-192-wide tiles); the clause decides
//   where the tok64 row's 96-tile minimum cannot be met (fewer SMs, e.g. the H20's 78).
// At M <= 64 the rows above leave it only the layers where the 64x32 row's tiles exceed one wave
// other than at 3 waves against 2 (M = 49..64, prefers_64x32, keeps_128x32).
using Sm90Pingpong64x64 = Config<true, 64, 64, 1, 1, Schedule::kPingpong, Consumer::kOverlap>;
using Sm90Swap128x64 = Config<true, 128, 64, 1, 1, Schedule::kCooperativeStreamK, Consumer::kOverlap, true>;
constexpr int64_t kThinSecondWaveMinM = 112, kThinSecondWaveMaxM = 128;
bool leaves_thin_second_wave(const Problem& p) {
  if (p.m < kThinSecondWaveMinM || p.m > kThinSecondWaveMaxM) return false;
  const int64_t second_wave = tile_count<Sm90Swap128x64>(p) - p.sm_count;
  return second_wave > 0 && 10 * second_wave <= 4 * p.sm_count;
}
bool prefers_64x64(const Problem& p) {
  if (p.m <= kSmallRowsMaxM) return true;
  const KPlan base = sm90::plan_config<Sm90Swap128x64>(p);
  const bool whole_k = !base.stream_k && base.splits == 1 && base.slices == 1;
  return whole_k && (fills_one_wave<Sm90Pingpong64x64>(p) || leaves_thin_second_wave(p));
}

// Selection precondition of the 128x64 row with K slices: where its K-slice rule (sm90_kernel.cuh,
// k_slices) cuts K, i.e. where the 128x64 row would run CUTLASS's split-K and a slice count divides the
// K blocks, or where slicing saves 16 blocks' walk. A row of its own so that the 64x64 row's precondition
// keeps asking about the unsliced 128x64 row it was measured against.
using Sm90Swap128x64Sliced =
    Config<true, 128, 64, 1, 1, Schedule::kCooperativeStreamK, Consumer::kOverlap, true, true>;
bool slices_k(const Problem& p) {
  return sm90::plan_config<Sm90Swap128x64Sliced>(p).slices > 1;
}

// Selection precondition of the 128x64 row: any M <= 128; above (M = 129..256) only where its tiles need
// no more waves than the 128x128 row's. In one wave it took 0.77-0.94x that row's time at all 10 such
// points of the benchmark set (0.86-0.95x at 27 held-out ones; ninth session); two waves against two,
// 0.72-0.92x at 14 held-out points (tenth session); where it needed more waves it lost at 32 of 33
// points (1.05-1.65x).
constexpr int64_t kSwapRowsAnyWavesUpToM = 128;
constexpr int64_t kSwapRowsMaxM = 256;  // the three 64-token-tile swap rows' bound
using Sm90Coop128 = Config<false, 128, 128, 2, 1, Schedule::kCooperative, Consumer::kOverlap>;
bool swap_waves_fit(const Problem& p) {
  return p.m <= kSwapRowsAnyWavesUpToM || waves<Sm90Swap128x64>(p) <= waves<Sm90Coop128>(p);
}

// Selection precondition of the persistent 128x64 row: where the 128x64 row below would be selected and run
// data-parallel (no split-K, no stream-K). The same tile and loop on CUTLASS's persistent scheduler, whose
// kernel is ~1600 SASS instructions against the stream-K one's ~4100: ~0.5 us less fixed cost a call (walk
// intercepts 4.1-4.4 against 4.6-5.0 us at M = 128), the same time per K block; 0.86-1.00x that row's time
// (geomean 0.949, faster at all 25) at the benchmark set's data-parallel points at M = 96 / 128 / 256, and
// 0.962 (max 0.994, faster at all 73) where it is selected on held-out sets 1-4 at M = 96..256; at the two
// stream-K points it lost 1.17-1.19x (gemm/NOTES.md fourteenth session).
using Sm90Swap128x64Persistent = Config<true, 128, 64, 1, 1, Schedule::kCooperative, Consumer::kOverlap>;
bool runs_whole_k(const Problem& p) {
  if (!swap_waves_fit(p)) return false;
  const KPlan plan = sm90::plan_config<Sm90Swap128x64>(p);
  return !plan.stream_k && plan.splits == 1;
}

// Selection precondition of the 128x128 row without a cluster: where the 2x1 cluster's padding tiles cost the
// persistent grid a whole round. With an odd number of 128-row token tiles, every 2x1 cluster of the last pair of
// token tiles carries a tile wholly past M (E29 made it load its partner's rows; it still takes an SM for a tile's
// time), so the 2x1 grid has a row of tiles (one per weight tile) more than there is work. Where the real tiles fit in
// fewer rounds of `sm_count` CTAs than the padded ones, the row without the cluster runs one round less: M = 384 on
// 5120x6144 is 120 tiles against 160 (one round against two: 0.64-0.65x the old row's time). It is the `_epi64x3`
// row's kernel (issue-ahead, 128x64 epilogue subtiles) less the weight tile's multicast: at the same K blocks the
// plain `_ovl` kernel without a cluster gave back up to 1.2x a tile at short K (1.06-1.13x on 32768x512 at 14-18
// rounds), this one 0.82-0.99x that where K <= 4096 and within 2% at longer K. Against the row the old table
// selected (`_sk`, `_epi64x3` or `_ovl`): 0.637-0.927x, geomean 0.823, at the 26 such points of the benchmark set
// at M = 384..1152, and 0.633-0.923x, geomean 0.837, at 37 fresh held-out points of 11 layers at M = 384..1408
// (gemm/NOTES.md twenty-ninth session, E30 / E30b); about (r - 1) / r of r rounds, so the least at many rounds.
// Never true at an even number of token tiles on an even SM count (no padding tile, the same wave), so the bands at
// M = 1024..8192 do not move.
using Sm90Coop128NoCluster =
    Config<false, 128, 128, 1, 1, Schedule::kCooperative, Consumer::kOverlap, false, false, 64, 3, true>;
bool saves_a_round(const Problem& p) {
  return waves<Sm90Coop128NoCluster>(p) < waves<Sm90Coop128>(p);
}

// Selection precondition of the 64-token-tile row above M = 256 (`sm90_tok64_fitn_narrow`): where its tiles, at the
// width its rule picks, make each SM load at most 3/4 of the bytes the 128x128 rows make it load. Each SM's TMA
// ingress binds both kernels (the tok64 width rule's model), so a kernel's time goes as its rounds times the bytes a
// CTA loads per K block: waves x (64 + width) x 128 against the 128x128 rows' rounds x 256 x 128 (the rounds of the
// row the table takes: 1x1 where `saves_a_round`, else the 2x1 grid). That holds on narrow layers, where the 128x128
// tiles leave SMs idle: 2112x7168 at M = 384 is 51 tiles of 128x128 but 132 of 64x96 (160 / 256). Against the row the
// table selected: 0.479-0.981x (geomean 0.755, faster at all 45) at the 45 such points of 20 earlier layers, and
// 0.530-0.923x (geomean 0.716, faster at all 61) on 12 fresh layers 288-2560 wide, M = 384..1536 (gemm/NOTES.md
// thirtieth session, E33). Between 3/4 and 0.85 (144 wide, 1-2 waves) it came out at 0.87-1.31x: not taken. Every
// point measured in the rule was one wave of tok64 tiles (16-128 wide), so the rule asks for one wave too (M = 300 on
// 6144x6144 would be two waves of 128-wide tiles against two rounds: unmeasured).
constexpr int64_t kTok64NarrowMinM = kSwapRowsMaxM + 1;
bool tok64_loads_less(const Problem& p) {
  if (p.m < kTok64NarrowMinM) return false;
  const int width = sm90::tok64::tile_n(p);
  if (sm90::tok64::tile_count(p, width) > p.sm_count) return false;
  const int64_t rounds_128 = std::min(waves<Sm90Coop128NoCluster>(p), waves<Sm90Coop128>(p));
  return 4 * (sm90::tok64::kTokenTile + width) <= 3 * rounds_128 * (128 + 128);
}

// Selection precondition of the stream-K 128x128 row: its rule (sm90_kernel.cuh, tail_wave_stream_k)
// takes stream-K for this problem; elsewhere the persistent row below runs it.
using Sm90Coop128StreamK = Config<false, 128, 128, 2, 1, Schedule::kCooperativeStreamK, Consumer::kOverlap>;
bool streams_tail_wave(const Problem& p) {
  return sm90::plan_config<Sm90Coop128StreamK>(p).stream_k;
}

// Selection precondition of the stream-K 128x128 row without a cluster: where the real tiles' last round is thin
// enough for the stream-K rule above but the 2x1 grid's, counting its padding tiles (odd token-tile counts), is not,
// and the real tiles exceed one round. The 4096-wide long-K layers at M = 640 are 160 real tiles (last round 28 / 132:
// stream-K) but 192 in 2x1 clusters (60 / 132: data-parallel). Where it fires the table selected `_ovl` before (K >
// 4096); against it 0.645-0.980x (geomean 0.878, faster at all 33) on 10 fresh long-K layers at M = 384..3200, most
// at 1-2.2 rounds (0.65-0.86), least at 18 (0.98) (gemm/NOTES.md thirtieth session, E32b). Left out, as E32 measured
// them: where the 2x1 `_sk` row already streams (0.85-1.03x, mixed) and below one round of real tiles (2112x7168 at
// M = 384, 51 tiles: 1.017x).
using Sm90Coop128NoClusterStreamK =
    Config<false, 128, 128, 1, 1, Schedule::kCooperativeStreamK, Consumer::kOverlap>;
bool streams_tail_without_cluster(const Problem& p) {
  return sm90::plan_config<Sm90Coop128NoClusterStreamK>(p).stream_k && !streams_tail_wave(p) &&
         waves<Sm90Coop128NoClusterStreamK>(p) > 1;
}

// Selection precondition of the 128x128 row with 128x64 epilogue subtiles in three buffers (sm90_kernel.h,
// kEpilogueN, kStoreStages): K of at most 30 blocks, M from 1024. CUTLASS's 128x32 subtiles (two buffers) make the
// math warpgroups wait three times a tile for a store to leave shared memory; at 4-30 K blocks those waits are a
// noticeable part of the tile's time. Three 128x64 buffers never wait within a tile; the 32 KiB more they take cost
// one of the 6 mainloop stages, which longer K notices, so the row keeps to short K: 0.80-0.92x the plain row on
// 32768x512, 0.895-1.002x (geomean 0.959) at the 28 K <= 1024 points of HELD_OUT_9 (seventeenth session, E15);
// at K = 1536-2048, 0.95-1.00x (geomean 0.974, faster at 70 of 72 points over 18 layers; eighteenth session,
// E17, interleaved timing); at K = 2304-3840, 0.97-1.00x (geomean 0.983 over 56 points of 14 layers, two calls;
// nineteenth session, E18); at K = 4096 0.989 (40 points; E18), then 0.98-1.01x (geomean 0.987, faster at 23 of 24)
// on six fresh K = 4096 layers (twenty-second session, E18b). At M = 384-768 (K <= 1024) it gained only 1.3-1.9%
// (42 points), before the issue-ahead kernel below.
// Since E27 (twenty-seventh session) the row runs the issue-ahead kernel (sm90_issue_ahead_kernel.cuh): each tile's
// first K block is issued before the previous tile's epilogue; 0.90-1.00x the row's time without it (geomean 0.969,
// faster at all 32 points of the benchmark set's K <= 4096 layers at M = 1024..8192; 32768x512 0.90-0.92).
// That saving comes at each tile change, so from M = 384 the row also takes K <= 4096 where its tiles exceed one wave
// (a CTA changes tile at least once; twenty-eighth session): 0.952-0.997x `_ovl`'s time (geomean 0.973, faster at all
// 47) on 12 fresh layers at M = 512..832 (E28b), 0.958-1.007x (geomean 0.979) on 11 more at M = 384..496 (E28c). At
// M = 256 it lost up to 1.03x (E28: the weights stream from DRAM about as fast as the tensor cores use them there, and
// the plain row's sixth mainloop stage hides their latency); at one wave or less, no tile change, 1.00-1.03x.
constexpr int64_t kShortKMaxK = 4096, kShortKMinM = 1024, kTileChangeMinM = 384;
using Sm90Coop128Epilogue64x3 =
    Config<false, 128, 128, 2, 1, Schedule::kCooperative, Consumer::kOverlap, false, false, 64, 3, true>;
bool has_short_k(const Problem& p) {
  if (p.k > kShortKMaxK) return false;
  if (p.m >= kShortKMinM) return true;
  return p.m >= kTileChangeMinM && waves<Sm90Coop128Epilogue64x3>(p) > 1;
}

// clang-format off
// Tile table, first fitting row wins. Config<swap_ab, tile_m, tile_n, cluster_m, cluster_n, schedule
// [, consumer loop]> in the kernel's operand order (weights x tokens when swapped). Each row is
// instantiated in sm90_<name>.cu. Reasons quote GEMM-only times on the H200 (NOTES.md has the tables).
const Sm90Row kRows[] = {
  make_row<Sm90Pingpong64x32>("sm90_swapab_64x32x128_pp_ovl", kSmallRowsMaxM,
      "64-row weight tiles, one ping-pong warpgroup each (weight scales read through a nested layout), our overlapped "
      "consumer loop (0.87-1.02x CUTLASS's, geomean 0.92, at the 19 points where that row was selected; tenth "
      "session), where those tiles fill one wave from 64 up: twice the CTAs of the row below without splitting K "
      "(0.77-0.95x its time at 21 fitted points, 0.74-0.99x at 12 held-out ones; seventh session); and where they "
      "need 3 waves and the row below's 2 (0.875-0.938x the selected row at 17 held-out points; eleventh session)",
      &prefers_64x32),
  make_row<Sm90Swap128x32>("sm90_swapab_128x32x128", kSmallRowsMaxM,
      "M <= 48, and M <= 64 where the 64-row tiles are fewer than 64, when the row above does not take it: swap-AB "
      "puts tokens on the cheap wgmma N side (32 wide); each CTA is K-block latency bound, so many small tiles win; "
      "K slices where its tiles leave SMs idle (held-out layers: 0.70-0.98x the unsliced time at 9 sliced points, "
      "geomean 0.81; CUTLASS's split-K, which they replace, lost up to 1.4x at short K; gemm/NOTES.md seventh session)",
      &keeps_128x32),
  make_tok64_row("sm90_tok64_fitn", kTok64MaxM,
      "M in (64, 128] where its tiles, 32 to 96 wide, fill one wave (96 up to the SM count): unswapped 64-token "
      "tiles, one math warpgroup, the weight-tile width picked so the tiles fill about one wave (straddling 128-row "
      "scale blocks), our own TMA/wgmma kernel with the weight scales resident in shared memory; 0.83-1.13x the row it displaces "
      "(geomean 0.948 at 46 held-out points, slower than 1.03x at 3; 0.929 at 16 benchmark points; "
      "gemm/NOTES.md sixteenth session, E9); 144-192 wide, where every other row needs two waves (N = 8449..12672): "
      "0.66-0.98x (geomean 0.779 at 26 fresh held-out points; twenty-third session, E22b), 192 wide at M = 112..128 "
      "0.81-0.94x (geomean 0.868 at 15 held-out points; twenty-fourth session, E22c)",
      &prefers_tok64),
  make_row<Sm90Pingpong64x64>("sm90_swapab_64x64x128_pp_ovl", kSwapRowsMaxM,
      "M = 49..64 where the 64x32 row's tiles exceed one wave (but not 3 waves against 2): one 64-token tile per weight tile streams each weight "
      "block once, not twice as the 128x32 row does (0.76-1.01x its time at 22 fitted points, 0.83-0.95x (geomean "
      "0.91) at 27 held-out ones; tenth session); M in (64, 256] where its 64-row tiles fill one wave and the "
      "128x64 row would run K whole: twice that row's CTAs (0.81-0.87x at 16 held-out points; seventh and eighth "
      "sessions); M = 112..128 where the 128x64 row's tiles leave a second wave at most 40% full: finer tiles in the "
      "thin wave (0.90-0.92x its time, geomean 0.911, at 15 fresh held-out points; twenty-second session, E20b); "
      "our overlapped consumer loop (0.87-0.97x CUTLASS's where selected; tenth session)",
      &prefers_64x64),
  make_row<Sm90Swap128x64Sliced>("sm90_swapab_128x64x128_ovl_slicek", kSwapRowsMaxM,
      "M in (64, 256] where its K-slice rule cuts K (mostly in place of CUTLASS's split-K): the row below with its K "
      "slices run as a batched fp32 launch plus a sum kernel; 0.67-0.96x that row's time (geomean 0.83) at all 16 "
      "such points of the benchmark and held-out sets (gemm/NOTES.md eighth session)",
      &slices_k),
  make_row<Sm90Swap128x64Persistent>("sm90_swapab_128x64x128_ovl_persistent", kSwapRowsMaxM,
      "where the row below is selected and runs K whole (data-parallel): the same tile and loop on CUTLASS's "
      "persistent scheduler, whose smaller kernel (~1600 SASS instructions, the stream-K one ~4100) costs ~0.5 us "
      "less a call; 0.86-1.00x that row's time (geomean 0.949, faster at all 25) at those points of the benchmark "
      "set, M = 96 / 128 / 256, and 0.962 (faster at all 73) at held-out ones (gemm/NOTES.md fourteenth session)",
      &runs_whole_k),
  make_row<Sm90Swap128x64>("sm90_swapab_128x64x128_ovl", kSwapRowsMaxM,
      "where it splits K (split-K, stream-K; the persistent twin above runs the rest): M in (64, 128], and up to 256 "
      "where its tiles need no more waves than the 128x128 row's (one wave: 0.77-0.94x "
      "that row at 10 benchmark points, 0.86-0.95x at 27 held-out ones; two against two: 0.72-0.92x at 14 held-out "
      "ones; ninth and tenth sessions): one 64-token tile per weight tile (CUTLASS's loop: fastest or within 2.2% "
      "on 6 of 8 shapes at M <= 128); our overlapped consumer loop takes 6.1% off that (30 points, M = 96 and 128, "
      "both run orders, faster at 28); CUTLASS's split-K at K >= 7168 where the `_slicek` row above does not take "
      "the problem (no slice count divides the K blocks; split-K was 0.87-0.92x unsplit on 2112x7168 and 4096x7168)",
      &swap_waves_fit),
  make_tok64_row("sm90_tok64_fitn_narrow", kUnboundedM,
      "M > 256 where its tiles fill at most one wave and make each SM load at most 3/4 of the bytes the 128x128 rows "
      "do (narrow layers, whose 128x128 tiles leave SMs idle; 16-128 wide): the `sm90_tok64_fitn` row's kernel; "
      "0.48-0.98x the row the table selected (geomean 0.755 at 45 points of 20 earlier layers, 0.716 at 61 points of "
      "12 fresh ones, faster at all; gemm/NOTES.md thirtieth session, E33)",
      &tok64_loads_less),
  make_row<Sm90Coop128NoCluster>("sm90_coop_128x128x128_c1x1_ovl_epi64x3", kUnboundedM,
      "where the 2x1 rows below would need a round of tiles more (an odd number of token tiles: their clusters' "
      "padding tiles): the `_epi64x3` row without the cluster runs one round less; 0.64-0.93x the time of the row the "
      "table selected before (geomean 0.823 at 26 benchmark-set points, 0.837 at 37 fresh held-out ones, M = "
      "384..1408; gemm/NOTES.md twenty-ninth session, E30b)",
      &saves_a_round),
  make_row<Sm90Coop128NoClusterStreamK>("sm90_coop_128x128x128_c1x1_ovl_sk", kUnboundedM,
      "where only the real tiles' last round is at most 40% full (K >= 48 blocks, more tiles than one round; an odd "
      "number of token tiles whose 2x1 padding tiles fill that round past the stream-K rule): the `_sk` row without "
      "its cluster; 0.645-0.980x the `_ovl` row it replaces (geomean 0.878, faster at all 33) on 10 fresh long-K "
      "layers at M = 384..3200 (gemm/NOTES.md thirtieth session, E32b)",
      &streams_tail_without_cluster),
  make_row<Sm90Coop128StreamK>("sm90_coop_128x128x128_c2x1_ovl_sk", kUnboundedM,
      "where the row below would leave its last wave at most 40% full and K >= 48 blocks: that row on CUTLASS's "
      "stream-K scheduler (all but the last full wave data-parallel, the rest split over one wave); 0.73-0.94x its "
      "time at 10 such points (2112x7168 at M = 1024, 136 tiles on 132 SMs: 0.77), 0.74-0.94x (geomean 0.84) at 14 "
      "held-out ones; 0.98-1.16x at short K and 1.03-1.50x with fuller last waves (gemm/NOTES.md ninth session)",
      &streams_tail_wave),
  make_row<Sm90Coop128Epilogue64x3>("sm90_coop_128x128x128_c2x1_ovl_epi64x3", kUnboundedM,
      "K <= 4096 from M = 1024, and from M = 384 where its tiles exceed one wave: the row below with 128x64 "
      "epilogue subtiles in three buffers (no wait on a store within a tile, where CUTLASS's 128x32 subtiles wait "
      "three times; 5 mainloop stages instead of 6), where "
      "the tile change is a large part of a tile's work: 0.80-0.92x its time on 32768x512, 0.895-1.002x (geomean "
      "0.959) at 28 fresh held-out points at K <= 1024 (seventeenth session, E15), 0.95-1.00x (geomean 0.974, "
      "faster at 70 of 72) at K = 1536-2048 (eighteenth session, E17), 0.97-1.00x (geomean 0.983 over 56 points) "
      "at K = 2304-3840 (nineteenth session, E18), 0.987 at 24 fresh points at K = 4096 (twenty-second session, "
      "E18b); each tile's first K block issued before the previous tile's epilogue: 0.90-1.00x its time without "
      "(geomean 0.969, faster at 32 of 32; twenty-seventh session, E27); from M = 384 at K <= 4096 where its tiles "
      "exceed one wave: 0.95-1.01x the row below (geomean 0.973 at 47 fresh held-out points at M = 512..832, 0.979 at "
      "33 more at M = 384..496; twenty-eighth session, E28b / E28c; gemm/NOTES.md)",
      &has_short_k),
  make_row<Sm90Coop128>("sm90_coop_128x128x128_c2x1_ovl", kUnboundedM,
      "128x128 cooperative; our consumer loop promotes each K block while the next one's wgmma runs: 6.2% faster "
      "than CUTLASS's loop (60 points, M = 1024..8192, both run orders, faster at 59); the 2x1 cluster multicasts "
      "each weight tile (1x1: 11-13% slower on 7168x16384 at M >= 4096, even elsewhere); takes every M the "
      "rows above do not (the CUTLASS-loop 128x128 row it replaced was the fastest from M = 256 up)"),
};
// clang-format on

constexpr int kNumRows = static_cast<int>(sizeof(kRows) / sizeof(kRows[0]));
constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

bool aligned(const void* ptr, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

// What every row needs; the rows differ only in speed, not in what they accept. Pointers are
// checked for alignment only, so that select() also answers shape-only queries (null pointers);
// launch() refuses null pointers.
const char* rejects_any(const Problem& p) {
  if (p.m < 0 || p.n < 1 || p.k < 1) return "m must be >= 0, n and k >= 1";
  if (p.k % 128 != 0) return "k must be a multiple of 128 (one scale per 128 values of K)";
  // The TMA store of D needs 16-byte rows (and 16-byte columns of D^T in the swapped rows).
  if (p.n % 8 != 0) return "n must be a multiple of 8 (16-byte rows of the output for TMA)";
  if (p.m > kMaxInt32 || p.n > kMaxInt32 || p.k > kMaxInt32) return "m, n and k must fit in int32";
  // The scale layouts carry int32 strides.
  if (p.a_scale_ld < p.m) return "a_scale_ld must be >= m";
  if (p.a_scale_ld % 4 != 0) return "a_scale_ld must be a multiple of 4 (16-byte TMA columns of a_scale)";
  if (p.a_scale_ld > kMaxInt32 / (p.k / 128)) return "a_scale_ld * k / 128 must fit in int32";
  if (!aligned(p.a, 16) || !aligned(p.b, 16) || !aligned(p.d, 16) || !aligned(p.a_scale, 16))
    return "a, b, d and a_scale must be 16-byte aligned (TMA)";
  if (!aligned(p.b_scale, 4)) return "b_scale must be 4-byte aligned";
  if (p.sm_count <= 0) return "sm_count must be > 0";
  return nullptr;
}

// Default persistent tile order (Problem::raster == -1): along M with swizzle up to 8 from M = 2048
// up, where it was measured on the H200 (NOTES.md, "Tile order measured": 7168x16384 at M = 2048 /
// 4096 / 8192 took 560 / 846 / 1987 us to 452 / 786 / 1574, the Qwen3-8B shapes moved within the
// noise, and the GPU GEMM tests passed under it on ragged tile grids), lowered per problem until
// CUTLASS pads the tile grid no further than whole clusters (fit_swizzle; sm90_kernel.cuh's
// launch_swizzle: swizzle 8 took 1.0-2.2x the fitted swizzle's time at 14 ragged points,
// gemm/NOTES.md eighth session); CUTLASS's defaults (heuristic order, swizzle 1) below, where no
// measurement covers it. Only the unbounded rows see M >= 2048. Resolved in one place so the
// workspace size and the launch agree.
constexpr int64_t kSwizzledOrderMinM = 2048;

Problem with_tile_order(Problem p) {
  if (p.raster < 0) {
    const bool swizzled = p.m >= kSwizzledOrderMinM;
    p.raster = swizzled ? 1 : 0;
    p.max_swizzle = swizzled ? 8 : 1;
    p.fit_swizzle = swizzled;
  }
  return p;
}

}  // namespace

int num_rows() { return kNumRows; }

const TileRow& row(int i) { return kRows[i].info; }

const char* rejects(int i, const Problem& p) {
  if (i < 0 || i >= kNumRows) return "row index out of range";
  return rejects_any(p);
}

int select(const Problem& p) {
  for (int i = 0; i < kNumRows; ++i) {
    if (kRows[i].info.max_m >= p.m && rejects(i, p) == nullptr && (!kRows[i].prefers || kRows[i].prefers(p)))
      return i;
  }
  return -1;
}

size_t workspace_bytes(int i, const Problem& p) {
  // Only the sizes matter here (the caller sizes the buffer before filling the pointers).
  if (i < 0 || i >= kNumRows || p.m < 1 || p.n < 1 || p.k < 128 || p.sm_count <= 0) return 0;
  return kRows[i].workspace(with_tile_order(p));
}

KPlan k_plan(int i, const Problem& p) {
  if (i < 0 || i >= kNumRows || p.m < 1 || p.n < 1 || p.k < 128 || p.sm_count <= 0) return {};
  return kRows[i].plan(with_tile_order(p));
}

cudaError_t launch(int i, const Problem& p, cudaStream_t s) {
  if (rejects(i, p) != nullptr) return cudaErrorInvalidValue;
  if (p.m == 0) return cudaSuccess;
  if (p.a == nullptr || p.b == nullptr || p.a_scale == nullptr || p.b_scale == nullptr || p.d == nullptr)
    return cudaErrorInvalidValue;
  return kRows[i].launch(with_tile_order(p), s);
}

}  // namespace blockfp8::gemm
