// SM89 W8A8 GEMM planner and the arch API (../arch.h) for the mma.sync rows (table.h, kernel.cuh). Host logic only.
//
// How a shape gets its plan, in one place (plan()):
//   1. The row: the first row of table.h whose max_m >= m (32, 64, then 128-token tiles). No cost model yet: the
//      bounds are the tile heights, to be moved by measurement (the H200 forced-row run, then an Ada GPU).
//   2. K slices: where the row's tiles are fewer than the SMs (decode-sized M on a narrow layer), K is cut into
//      slices = min(sm_count / tiles, K blocks / kMinKBlocksPerSlice, kMaxSlices) so about one wave of CTAs runs;
//      each slice keeps >= kMinKBlocksPerSlice K blocks (a slice pays its pipeline fill and an fp32 partial tile
//      round trip), and the count is lowered until no slice is empty. Deterministic: the sum kernel adds slices in
//      order.
//   3. Tile order: groups of kGroupM token tiles walk N together (L2 reuse of each weight tile across the group);
//      a single token tile (small M) is a plain walk along N.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "../arch.h"
#include "table.h"

namespace blockfp8::gemm::sm89 {
namespace {

constexpr int64_t kMinKBlocksPerSlice = 4;  // >= 512 values of K per slice
constexpr int64_t kMaxSlices = 8;
constexpr int kGroupM = 8;

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t tiles_of(const Kernel& c, const Problem& p) { return cdiv(p.m, c.bm) * cdiv(p.n, c.bn); }

// K slices for row `row` on p (1: K runs whole).
int k_slices(int row, const Problem& p) {
  const int64_t tiles = tiles_of(kRows[row].kernel, p), kblocks = p.k / 128;
  if (tiles <= 0 || tiles >= p.sm_count) return 1;
  int64_t s = std::min({int64_t(p.sm_count) / tiles, kblocks / kMinKBlocksPerSlice, kMaxSlices});
  if (s < 2) return 1;
  const int64_t per = cdiv(kblocks, s);
  return int(cdiv(kblocks, per));  // no empty slice: every partial tile gets written
}

}  // namespace

int num_rows() { return kNumRows; }
const TileRow& row(int i) { return kRows[i].info; }

// What every row needs (the rows differ in speed only). Pointers are checked for alignment only, so shape-only
// queries (null pointers) are answered too; launch() refuses null pointers.
const char* rejects(const Problem& p) {
  if (const char* why = contract_rejects(p)) return why;
  // cp.async copies 16-byte chunks of A and B rows (k % 128 keeps every row aligned); pairs of D are 32-bit stores.
  if (!aligned(p.a, 16) || !aligned(p.b, 16) || !aligned(p.d, 16)) return "a, b and d must be 16-byte aligned";
  if (!aligned(p.a_scale, 4) || !aligned(p.b_scale, 4)) return "a_scale and b_scale must be 4-byte aligned";
  return nullptr;
}

Plan plan(const Problem& p, int forced_row) {
  Plan out;
  if (forced_row >= kNumRows || forced_row < -1) return out;
  if (forced_row >= 0) {
    out.row = forced_row;  // the caller has checked rejects()
  } else {
    if (sm89::rejects(p) != nullptr) return out;
    out.row = first_row_taking(kRows, kNumRows, p.m, [](int) -> const char* { return nullptr; });
  }
  if (p.m < 1 || p.n < 1 || p.k < 128 || p.sm_count <= 0) return out;  // nothing runs: no K plan
  out.slices = k_slices(out.row, p);
  const bool grouped = cdiv(p.m, kRows[out.row].kernel.bm) > 1;
  out.raster = grouped ? 1 : 2;  // along M within a group, else along N
  out.swizzle = grouped ? kGroupM : 1;
  return out;
}

size_t workspace_bytes(const Problem& p, const Plan& plan) {
  if (plan.slices <= 1) return 0;
  return size_t(plan.slices) * size_t(p.m) * size_t(p.n) * sizeof(float);
}

cudaError_t launch(const Problem& p, const Plan& plan, cudaStream_t s) {
  if (sm89::rejects(p) != nullptr || plan.row < 0 || plan.row >= kNumRows || plan.slices < 1) return cudaErrorInvalidValue;
  if (p.a == nullptr || p.b == nullptr || p.d == nullptr || p.a_scale == nullptr || p.b_scale == nullptr)
    return cudaErrorInvalidValue;
  if (p.m == 0) return cudaSuccess;
  if (plan.slices > 1 && (p.workspace == nullptr || p.workspace_size < sm89::workspace_bytes(p, plan)))
    return cudaErrorInvalidValue;
  if (plan.slices > 65535) return cudaErrorInvalidValue;  // gridDim.z
  Launch l;
  l.row = plan.row;
  l.slices = plan.slices;
  l.group_m = std::max(plan.swizzle, 1);
  return launch_row(p, l, s);
}

}  // namespace blockfp8::gemm::sm89
