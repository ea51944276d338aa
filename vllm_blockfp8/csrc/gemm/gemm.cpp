// The W8A8 GEMM family's router: which arch table serves a device, and each call sent to that table (arch.h). Host
// logic only. The table for a device is its own (SM89, SM90, SM120) unless a process forces another whose kernels
// run there: the SM89 rows are compiled for sm_90a as well, so the H200 tests and times them as forced rows.
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "arch.h"

namespace blockfp8::gemm {
namespace {

// 0: the device's own table; kNone: no table (the linear op's W8A8 path is off); otherwise the forced arch.
constexpr int kNone = 1;

int parse_table(const char* name) {
  if (name == nullptr || name[0] == '\0' || std::strcmp(name, "auto") == 0) return 0;
  if (std::strcmp(name, "none") == 0) return kNone;
  if (std::strcmp(name, "sm89") == 0) return 89;
  if (std::strcmp(name, "sm90") == 0) return 90;
  if (std::strcmp(name, "sm120") == 0) return 120;
  return -1;
}

const char* table_name(int t) {
  return t == 89 ? "sm89" : t == 90 ? "sm90" : t == 120 ? "sm120" : t == kNone ? "none" : "auto";
}

// BLOCKFP8_GEMM_TABLE, read once (ops.py refuses an unknown name at import); set_table() changes it later.
std::atomic<int>& forced_table() {
  static std::atomic<int> slot{[] {
    const int t = parse_table(std::getenv("BLOCKFP8_GEMM_TABLE"));
    return t < 0 ? 0 : t;
  }()};
  return slot;
}

// Whether the kernels of table `arch` run on a device of compute capability `cc` (sm_120a code runs on SM120 only;
// the SM89 units carry sm_89 and sm_90a code).
bool runs_on(int arch, int cc) {
  if (!built(arch)) return false;
  if (arch == 89) return cc == 89 || cc == 90;
  return arch == cc;
}

const TileRow kNoRow{"none", 0, "no W8A8 GEMM table"};

}  // namespace

bool built(int arch) {
  switch (arch) {
#ifdef BLOCKFP8_HAS_SM89_GEMM
    case 89: return true;
#endif
#ifdef BLOCKFP8_HAS_SM90_GEMM
    case 90: return true;
#endif
#ifdef BLOCKFP8_HAS_SM120_GEMM
    case 120: return true;
#endif
    default: return false;
  }
}

int table_arch(int device_cc) {
  const int forced = forced_table().load();
  if (forced == kNone) return 0;
  if (forced != 0 && runs_on(forced, device_cc)) return forced;
  return runs_on(device_cc, device_cc) ? device_cc : 0;
}

bool off() { return forced_table().load() == kNone; }

const char* set_table(const char* name) {
  if (name == nullptr || name[0] == '\0') return nullptr;  // "" means unset only in the environment
  const int t = parse_table(name);
  if (t < 0) return nullptr;
  return table_name(forced_table().exchange(t));
}

// One switch per entry point: the arch's own function, or the answer for a table this build lacks.
#ifdef BLOCKFP8_HAS_SM89_GEMM
#define BLOCKFP8_CASE_SM89(call) case 89: return sm89::call;
#else
#define BLOCKFP8_CASE_SM89(call)
#endif
#ifdef BLOCKFP8_HAS_SM90_GEMM
#define BLOCKFP8_CASE_SM90(call) case 90: return sm90::call;
#else
#define BLOCKFP8_CASE_SM90(call)
#endif
#ifdef BLOCKFP8_HAS_SM120_GEMM
#define BLOCKFP8_CASE_SM120(call) case 120: return sm120::call;
#else
#define BLOCKFP8_CASE_SM120(call)
#endif
#define BLOCKFP8_ROUTE(arch, call, otherwise) \
  switch (arch) {                             \
    BLOCKFP8_CASE_SM89(call)                  \
    BLOCKFP8_CASE_SM90(call)                  \
    BLOCKFP8_CASE_SM120(call)                 \
    default: return otherwise;                \
  }

int num_rows(int arch) { BLOCKFP8_ROUTE(arch, num_rows(), 0) }
const TileRow& row(int arch, int i) { BLOCKFP8_ROUTE(arch, row(i), kNoRow) }
const char* rejects(const Problem& p) {
  BLOCKFP8_ROUTE(p.arch, rejects(p), "this build has no W8A8 GEMM table for this arch")
}
Plan plan(const Problem& p, int forced_row) { BLOCKFP8_ROUTE(p.arch, plan(p, forced_row), Plan{}) }
size_t workspace_bytes(const Problem& p, const Plan& plan) {
  BLOCKFP8_ROUTE(p.arch, workspace_bytes(p, plan), size_t{0})
}
cudaError_t launch(const Problem& p, const Plan& plan, cudaStream_t s) {
  BLOCKFP8_ROUTE(p.arch, launch(p, plan, s), cudaErrorInvalidValue)
}

}  // namespace blockfp8::gemm
