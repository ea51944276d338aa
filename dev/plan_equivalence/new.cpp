// The worktree's SM90 planner, compiled from its files as they are (the include path points at csrc/).
#include "gemm/sm90/options.cpp"
#include "gemm/sm90/plan.cpp"
#include "result.h"

const char* ref_getenv(const char* name);

Result new_eval(int64_t m, int64_t n, int64_t k, int sms, int forced) {
  using namespace blockfp8::gemm;
  Problem p;  // the shape the host queries plan (linear::gemm_shape)
  p.m = m, p.n = n, p.k = k, p.a_scale_ld = (m + 3) / 4 * 4, p.out_bf16 = true, p.sm_count = sms;
  const sm90::Options o = sm90::parse_options(&ref_getenv);
  const char* v = ref_getenv("BLOCKFP8_SM90_PDL");
  if (v == nullptr || *v == '\0' || set_pdl_mode(v) == nullptr) set_pdl_mode("1");  // the default, as options.cpp
  const Plan pl = sm90::plan(p, o, sm90::pdl_mode(), forced);
  Result r;
  r.row = pl.row, r.stream_k = pl.stream_k, r.splits = pl.splits, r.slices = pl.slices, r.raster = pl.raster;
  r.swizzle = pl.swizzle, r.tile_n = pl.tile_n, r.pdl = pl.pdl, r.quant_triggers = quant_triggers(k);
  r.nondet = pl.nondeterministic_reduction;
  return r;
}
int new_num_rows() { return blockfp8::gemm::sm90::kNumRows; }
const char* new_row_name(int i) { return blockfp8::gemm::sm90::kRows[i].info.name; }
int64_t new_row_max_m(int i) { return blockfp8::gemm::sm90::kRows[i].info.max_m; }
