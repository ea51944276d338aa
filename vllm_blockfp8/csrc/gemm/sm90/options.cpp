// SM90 W8A8 GEMM runtime options: the benchmark switches and the launch mode (plan.h describes each), read once here.
// Compiled in every build: the activation quantizer follows the launch mode even where no SM90 GEMM is built.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "plan.h"

namespace blockfp8::gemm::sm90 {
namespace {

bool is(const char* v, const char* what) { return std::strcmp(v, what) == 0; }

// Mode 1's bound. Launched early, the GEMM's CTAs take SMs in the order the quantizer's CTAs leave them, and the
// replays then vary: that costs a bandwidth-bound GEMM in proportion to its K walk (up to 1.25x at K = 16384, H200),
// while the early launch saves a fixed ~1 us.
constexpr int64_t kPdlMaxK = 4096;

// Atomic: a benchmark thread may switch it while another launches (a torn read would only pick a mode).
std::atomic<int>& mode_slot() {
  static std::atomic<int> mode([] {
    const char* v = std::getenv("BLOCKFP8_SM90_PDL");
    const int m = v && *v ? parse_pdl_mode(v) : int(PdlMode::kQuantTriggers);
    return m < 0 ? int(PdlMode::kQuantTriggers) : m;  // ops.py rejects other values at import
  }());
  return mode;
}

}  // namespace

// Nothing here throws: ops.py has checked the values at import.
Options parse_options(Getenv getenv) {
  Options o;
  if (const char* r = getenv("BLOCKFP8_SM90_RASTER"); r && *r) {
    o.order_from_env = true;
    o.raster = is(r, "along_m") ? 1 : is(r, "along_n") ? 2 : 0;
  }
  if (const char* w = getenv("BLOCKFP8_SM90_SWIZZLE"); w && *w) {
    o.order_from_env = true;
    o.max_swizzle = is(w, "2") ? 2 : is(w, "4") ? 4 : is(w, "8") ? 8 : 1;
  }
  if (const char* n = getenv("BLOCKFP8_SM90_SPLITS"); n && *n) o.splits = std::max(0, std::atoi(n));
  if (const char* r = getenv("BLOCKFP8_SM90_REDUCTION"); r && *r) o.nondeterministic_reduction = is(r, "nondeterministic");
  if (const char* w = getenv("BLOCKFP8_SM90_TILE_N"); w && *w) o.tile_n = std::max(0, std::atoi(w));
  if (const char* s = getenv("BLOCKFP8_SM90_NARROW_SPLIT"); s && *s) o.narrow_split = is(s, "1");
  return o;
}

const Options& options() {
  static const Options o = parse_options([](const char* name) -> const char* { return std::getenv(name); });
  return o;
}

int parse_pdl_mode(const char* v) {
  return is(v, "1") ? int(PdlMode::kQuantTriggers) : is(v, "gemm") ? int(PdlMode::kGemmOnly)
                                                   : is(v, "0")    ? int(PdlMode::kOff)
                                                                   : -1;
}

const char* pdl_mode_name(PdlMode mode) {
  return mode == PdlMode::kQuantTriggers ? "1" : mode == PdlMode::kGemmOnly ? "gemm" : "0";
}

PdlMode pdl_mode() { return PdlMode(mode_slot().load(std::memory_order_relaxed)); }

LaunchMode launch_mode(PdlMode mode, int64_t k) {
  LaunchMode l;
  l.quant_triggers = mode == PdlMode::kQuantTriggers && k <= kPdlMaxK;
  l.pdl = mode == PdlMode::kGemmOnly || l.quant_triggers;
  return l;
}

}  // namespace blockfp8::gemm::sm90

namespace blockfp8::gemm {

bool quant_triggers(int64_t k) { return sm90::launch_mode(sm90::pdl_mode(), k).quant_triggers; }

const char* set_pdl_mode(const char* mode) {
  const int m = sm90::parse_pdl_mode(mode);
  if (m < 0) return nullptr;
  return sm90::pdl_mode_name(sm90::PdlMode(sm90::mode_slot().exchange(m)));
}

}  // namespace blockfp8::gemm
