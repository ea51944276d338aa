// SM120 native NVFP4 x NVFP4 GEMM: the tile table, its preconditions, and the rule that sends an nvfp4_linear
// call to it (native.h). Host code, compiled into every build; the rows exist where the build has sm_120a
// (BLOCKFP8_HAS_SM120_NVFP4), otherwise the table is empty and path_rejects says why.
//
// The rows are compiled (ptxas: fp4/sm120/NOTES.md) but have never run on SM120 hardware here: their reasons are
// design reasons, to be replaced by measurements. Only what CUTLASS's SM120 collective allows is listed: tiles
// are 128 rows of M (the scale-factor atom is 128 rows) and >= 128 of N; no clusters (SM120 has no multicast).
#include <cstdint>
#include <cstdlib>

#include "../native.h"
#ifdef BLOCKFP8_HAS_SM120_NVFP4
#include "kernels.h"
#endif

namespace blockfp8::fp4::native {
namespace {

constexpr int64_t kMaxDim = int64_t(1) << 31;  // CUTLASS's problem shape is int

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// What every row needs: whole 16-byte TMA boxes, N % 32 as vLLM's SM120 NVFP4 GEMM (the same collective)
// requires, and whole K tiles (the collective's K residue path has not run on hardware here).
const char* shared_rejects(const GemmProblem& p, int64_t tile_k) {
  if (p.m < 0 || p.n <= 0 || p.k <= 0) return "M must be >= 0, N and K > 0";
  if (p.m >= kMaxDim || p.n >= kMaxDim || p.k >= kMaxDim) return "M, N and K must be below 2^31";
  if (p.n % 32 != 0) return "N must be a multiple of 32";
  if (p.k % tile_k != 0) return tile_k == 256 ? "K must be a multiple of 256 (whole 256-deep K tiles)"
                                              : "K must be a multiple of 128 (whole 128-deep K tiles)";
  if (!aligned16(p.a) || !aligned16(p.b) || !aligned16(p.a_sf) || !aligned16(p.b_sf) || !aligned16(p.d))
    return "a, b, their scales and the output must be 16-byte aligned (TMA)";
  return nullptr;
}

#ifdef BLOCKFP8_HAS_SM120_NVFP4

using Launcher = cudaError_t (*)(const GemmProblem&, cudaStream_t);
using Workspace = size_t (*)(const GemmProblem&);

struct NativeRow {
  TileRow info;
  int64_t tile_k;
  Launcher launch;
  Workspace workspace;
};

// Ordered: the first row with max_m >= M whose precondition holds wins. Not measured yet (no SM120 here).
constexpr NativeRow kRows[] = {
    {{"nvfp4_sm120_128x128x256", 128, "M = 17..128 (one 128-row tile): the grid is one wave of N tiles and the "
                                      "K loop is the latency chain, so a 256-deep step halves its barrier round "
                                      "trips (design choice, unmeasured)"},
     256, &sm120::launch_128x128x256, &sm120::workspace_128x128x256},
    {{"nvfp4_sm120_128x128x128", kUnboundedM, "any M: the tile CUTLASS example 79a and vLLM's SM120 NVFP4 GEMM "
                                              "ship; a 128-deep step leaves shared memory for more stages"},
     128, &sm120::launch_128x128x128, &sm120::workspace_128x128x128},
};
constexpr int kNumRows = int(sizeof(kRows) / sizeof(kRows[0]));
static_assert(kRows[kNumRows - 1].info.max_m == kUnboundedM, "the last row must take any M");

#else

struct NativeRow {
  TileRow info;
  int64_t tile_k;
};
constexpr NativeRow kRows[] = {{{"none", kUnboundedM, "this build has no sm_120a"}, 0}};
constexpr int kNumRows = 0;

#endif

bool w4a16_forced() {
  static const bool forced = [] {
    const char* v = std::getenv("BLOCKFP8_NVFP4_W4A16");
    return v != nullptr && v[0] != '\0' && v[0] != '0';
  }();
  return forced;
}

}  // namespace

int num_rows() { return kNumRows; }

const TileRow& row(int i) { return kRows[i].info; }

const char* rejects(int i, const GemmProblem& p) {
  if (i < 0 || i >= kNumRows) return "row index out of range";
  return shared_rejects(p, kRows[i].tile_k);
}

int select(const GemmProblem& p) {
  return first_row_taking(kRows, kNumRows, p.m, [&](int i) { return rejects(i, p); });
}

size_t workspace_bytes(int i, const GemmProblem& p) {
#ifdef BLOCKFP8_HAS_SM120_NVFP4
  if (rejects(i, p) == nullptr) return kRows[i].workspace(p);
#endif
  (void)i, (void)p;
  return 0;
}

cudaError_t launch(int i, const GemmProblem& p, cudaStream_t s) {
  if (rejects(i, p) != nullptr) return cudaErrorInvalidValue;
  if (p.m == 0) return cudaSuccess;
#ifdef BLOCKFP8_HAS_SM120_NVFP4
  return kRows[i].launch(p, s);
#else
  (void)s;
  return cudaErrorNotSupported;
#endif
}

const char* path_rejects(int cc, int64_t m, int64_t n, int64_t k) {
  if (kNumRows == 0) return "this build has no SM120 NVFP4 GEMM (sm_120a not in TORCH_CUDA_ARCH_LIST)";
  if (w4a16_forced()) return "BLOCKFP8_NVFP4_W4A16 is set: NVFP4 stays weight-only (W4A16)";
  if (cc != 120) return "the native NVFP4 GEMM is built for sm_120a, which runs on compute capability 12.0 only";
  if (m < kNativeMinM) return "M <= 16: the decode GEMV (plain scales, no activation quant) serves it";
  GemmProblem shape;  // null pointers pass the alignment checks: shapes only
  shape.m = m, shape.n = n, shape.k = k;
  if (select(shape) < 0) return "no native row takes this N and K (N % 32, K % 128)";
  return nullptr;
}

}  // namespace blockfp8::fp4::native
