// SM120 W8A8 GEMM: which row takes a problem, and what every row needs. Host logic only (sizes, sm_count): no CUDA
// calls, no CUTLASS, so CPU tests ask it through ops.gemm_table_plan("sm120", ...).
//
// The plan is the M bucket (table.h, first row whose max_m >= m): the rows differ in speed only, and no SM120
// measurement exists yet to justify a cost model (the SM90 planner's rules are H200 measurements; SM120 has
// ~99 KiB of shared memory, mma.sync and no multicast, so they do not carry over). K runs whole, CUTLASS's
// persistent tile order, no programmatic dependent launch.
#include <cstdint>
#include <limits>

#include "../arch.h"
#include "table.h"

namespace blockfp8::gemm::sm120 {
namespace {

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

}  // namespace

// What every row needs (the rows differ in speed only): the family contract, then what TMA asks. Pointers are
// checked for alignment only, so that shape-only queries (null pointers) are answered too; launch() refuses null
// pointers.
const char* rejects(const Problem& p) {
  if (const char* why = contract_rejects(p)) return why;
  // The TMA store of D needs 16-byte rows (and 16-byte columns of D^T in the swapped rows); the operand TMA loads
  // need 16-byte rows of A and B, which k % 128 == 0 gives. The token scales are read by 4-byte cp.async copies (no
  // TMA), so any a_scale_ld >= m serves.
  if (p.n % 8 != 0) return "n must be a multiple of 8 (16-byte rows of the output for TMA)";
  if ((p.n + 127) / 128 > kMaxInt32 / (p.k / 128)) return "ceil(n / 128) * k / 128 must fit in int32";
  if (!aligned(p.a, 16) || !aligned(p.b, 16) || !aligned(p.d, 16)) return "a, b and d must be 16-byte aligned (TMA)";
  if (!aligned(p.a_scale, 4) || !aligned(p.b_scale, 4)) return "a_scale and b_scale must be 4-byte aligned";
  return nullptr;
}

int num_rows() { return kNumRows; }
const TileRow& row(int i) { return kRows[i].info; }

Plan plan(const Problem& p, int forced_row) {
  Plan out;
  if (forced_row >= kNumRows || forced_row < -1) return out;
  if (forced_row >= 0) {
    out.row = forced_row;  // the caller has checked rejects()
    return out;
  }
  if (sm120::rejects(p) != nullptr) return out;
  out.row = first_row_taking(kRows, kNumRows, p.m, [](int) -> const char* { return nullptr; });
  return out;
}

}  // namespace blockfp8::gemm::sm120
