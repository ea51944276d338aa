// SM90 (sm_90a only) W8A8 block-scaled FP8 GEMM: the tile table, row checks and dispatch.
//
//   D[m, n] = sum_kb (A[m, kb-block] . B[n, kb-block]) * SFA[m, kb] * SFB[n / 128, kb]
//   A fp8 [m, k] K-major, SFA fp32 per token per 128 K (M-major, ld % 4 == 0), B fp8 [n, k]
//   K-major, SFB fp32 [ceil(n/128), k/128] row-major, D bf16/fp16 [m, n] row-major.
//
// Kernels: CUTLASS cooperative TMA/wgmma mainloop with blockwise scaling (sm90_kernel.cuh); each
// row's two instantiations (bf16 and fp16 out) live in the sm90_<row>.cu file named in the row.
// Unsupported (rejected with a reason): k % 128 != 0, n % 8 != 0, misaligned pointers, sizes past
// int32, bias (not implemented yet).
#include <cstdint>
#include <limits>

#include "gemm.h"
#include "sm90_kernel.h"

namespace blockfp8::gemm {
namespace {

using sm90::Config;
using sm90::Schedule;

struct Sm90Row {
  TileRow info;
  cudaError_t (*launch)(const Problem&, cudaStream_t);
  size_t (*workspace)(const Problem&);
};

template <class Cfg>
constexpr Sm90Row make_row(const char* name, int64_t max_m, const char* reason) {
  return {{name, max_m, reason}, &sm90::launch_config<Cfg>, &sm90::workspace_config<Cfg>};
}

// clang-format off
// Tile table, first fitting row wins. Config<swap_ab, tile_m, tile_n, cluster_m, cluster_n, schedule>
// in the kernel's operand order (weights x tokens when swapped). Reasons are expectations until the
// H200 measurements replace them. Instantiated in: sm90_swapab_streamk_128x32x128.cu,
// sm90_swapab_streamk_128x64x128.cu, sm90_coop_streamk_128x128x128.cu, sm90_coop_128x128x128_c1x2.cu.
const Sm90Row kRows[] = {
  make_row<Config<true, 128, 32, 1, 1, Schedule::kCooperativeStreamK>>("sm90_swapab_streamk_128x32x128", 32,
      "tokens on the narrow wgmma N side (n32) waste no MMA rows; stream-K spreads the few n/128 tiles' K over all SMs"),
  make_row<Config<true, 128, 64, 1, 1, Schedule::kCooperativeStreamK>>("sm90_swapab_streamk_128x64x128", 64,
      "m in (32, 64] in one n64 token tile, so each weight tile is streamed once; stream-K fills the SMs"),
  make_row<Config<false, 128, 128, 1, 1, Schedule::kCooperativeStreamK>>("sm90_coop_streamk_128x128x128", 2048,
      "128x128 cooperative; stream-K removes the partial last wave while tiles are only a few waves"),
  make_row<Config<false, 128, 128, 1, 2, Schedule::kCooperative>>("sm90_coop_128x128x128_c1x2", kUnboundedM,
      "many waves: data-parallel persistent tiles, 1x2 cluster multicasts the A tile to both N tiles; no workspace"),
  make_row<Config<false, 64, 128, 1, 1, Schedule::kPingpong>>("sm90_pingpong_64x128x128", kUnboundedM,
      "experiment"),
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

}  // namespace

int num_rows() { return kNumRows; }

const TileRow& row(int i) { return kRows[i].info; }

const char* rejects(int i, const Problem& p) {
  if (i < 0 || i >= kNumRows) return "row index out of range";
  return rejects_any(p);
}

int select(const Problem& p) {
  for (int i = 0; i < kNumRows; ++i) {
    if (kRows[i].info.max_m >= p.m && rejects(i, p) == nullptr) return i;
  }
  return -1;
}

size_t workspace_bytes(int i, const Problem& p) {
  // Only the sizes matter here (the caller sizes the buffer before filling the pointers).
  if (i < 0 || i >= kNumRows || p.m < 1 || p.n < 1 || p.k < 128 || p.sm_count <= 0) return 0;
  return kRows[i].workspace(p);
}

cudaError_t launch(int i, const Problem& p, cudaStream_t s) {
  if (rejects(i, p) != nullptr) return cudaErrorInvalidValue;
  if (p.m == 0) return cudaSuccess;
  if (p.a == nullptr || p.b == nullptr || p.a_scale == nullptr || p.b_scale == nullptr || p.d == nullptr)
    return cudaErrorInvalidValue;
  return kRows[i].launch(p, s);
}

}  // namespace blockfp8::gemm
