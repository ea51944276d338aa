// SM90 (sm_90a only) NVFP4 W4A16 wgmma GEMM: instantiations and launchers (the kernel: w4a16_wgmma.cuh, which
// opens with the math, the layouts and what is unsupported). Compiled only when the build has 9.0a.
#include <algorithm>
#include <cstdint>

#include "../../common/vector_rows.h"
#include "kernels.h"
#include "w4a16_wgmma.cuh"

namespace blockfp8::fp4::sm90 {
namespace {

constexpr int64_t kMaxGridY = 65535;  // grid.y holds the 128-row tiles
constexpr int kMaxSplits = 16;
constexpr int kMinStagesPerSplit = 8;  // 512 of K: the ring fills before a split ends

template <typename T>
Args<T> make_args(const Problem& p) {
  return Args<T>{static_cast<const T*>(p.x), p.b, p.b_scale, p.global_scale, p.global_scale_stride,
                 static_cast<const T*>(p.bias), static_cast<T*>(p.out), int(p.m), int(p.n), int(p.k),
                 p.x_stride, p.out_stride};
}

template <int TOK>
const char* rejects_t(const Problem& p) {
  if (p.cc != 90) return "wgmma needs compute capability 9.0 (the unit is built for sm_90a only)";
  if (p.packing != Packing::kFragment)
    return "the wgmma rows read the fragment packing only (ops.fragment_nvfp4_weight; the vLLM layer stores it on SM90)";
  if (WgmmaTile<TOK>::kSmemBytes > p.max_smem)
    return "the tile's pipeline needs more shared memory per block than this GPU has";
  if ((p.n + kRows - 1) / kRows > kMaxGridY) return "N must be at most 65535 * 128 (128-row tiles on grid.y)";
  return rows_16byte_aligned(p.x, p.m, p.x_stride) ? nullptr : kRowsNot16ByteAligned;
}

// Where the output tiles leave CTA slots (the tile's CTAs per SM x SMs) idle, split K: the split count s that
// minimizes waves(s) x (stages / s + ring fill), waves(s) = ceil(tiles s / slots), the smaller on a tie (less fp32
// partial traffic); each split at least 8 stages, at most 16 splits. Counting slots rather than SMs matters for
// the 1-CTA-per-SM 128x256 tile: "about two CTAs per SM" launched 6 splits (288 CTAs, 3 waves) for qkv at M = 256.
template <int TOK>
int splits_t(const Problem& p) {
  const int64_t tiles = ((p.m + TOK - 1) / TOK) * ((p.n + kRows - 1) / kRows);
  const int64_t slots = int64_t(WgmmaTile<TOK>::kMinBlocks) * p.sm_count;
  if (tiles == 0 || tiles >= slots) return 1;
  const int64_t stages = p.k / kStageK, fill = kXStages;
  const int64_t most = std::max<int64_t>(1, std::min<int64_t>(stages / kMinStagesPerSplit, kMaxSplits));
  int64_t best = 1, best_waves = 1, best_len = stages + fill;  // cost = waves x the length of one split
  for (int64_t s = 2; s <= most; ++s) {
    const int64_t waves = (tiles * s + slots - 1) / slots, len = (stages + s - 1) / s + fill;
    if (waves * len < best_waves * best_len) best = s, best_waves = waves, best_len = len;
  }
  return int(best);
}

template <int TOK, typename T>
cudaError_t launch_t(const Problem& p, cudaStream_t s) {
  using Tile = WgmmaTile<TOK>;
  auto* kernel = &w4a16_wgmma_kernel<TOK, T>;
  // On every launch, not once per process: the attribute is per device (multi-GPU processes).
  const cudaError_t attr = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSmemBytes);
  if (attr != cudaSuccess) return attr;
  const int splits = splits_t<TOK>(p);
  if (splits > 1 && p.workspace == nullptr) return cudaErrorInvalidValue;
  const dim3 grid(unsigned((p.m + TOK - 1) / TOK), unsigned((p.n + kRows - 1) / kRows), unsigned(splits));
  kernel<<<grid, kThreads, Tile::kSmemBytes, s>>>(make_args<T>(p), static_cast<float*>(p.workspace));
  return cudaGetLastError();
}

template <int TOK>
cudaError_t launch_tok(const Problem& p, cudaStream_t s) {
  return p.bf16 ? launch_t<TOK, __nv_bfloat16>(p, s) : launch_t<TOK, __half>(p, s);
}

}  // namespace

const char* w4a16_wgmma_rejects(int tok, const Problem& p) {
  switch (tok) {
    case 32: return rejects_t<32>(p);
    case 64: return rejects_t<64>(p);
    case 128: return rejects_t<128>(p);
    case 256: return rejects_t<256>(p);
    default: return "no wgmma tile with that many tokens (32, 64, 128, 256)";
  }
}

int w4a16_wgmma_splits(int tok, const Problem& p) {
  switch (tok) {
    case 32: return splits_t<32>(p);
    case 64: return splits_t<64>(p);
    case 128: return splits_t<128>(p);
    case 256: return splits_t<256>(p);
    default: return 1;
  }
}

size_t w4a16_wgmma_workspace(int tok, const Problem& p) {
  const int splits = w4a16_wgmma_splits(tok, p);
  return splits > 1 ? size_t(splits) * size_t(p.m) * size_t(p.n) * sizeof(float) : 0;
}

cudaError_t launch_w4a16_wgmma(int tok, const Problem& p, cudaStream_t s) {
  switch (tok) {
    case 32: return launch_tok<32>(p, s);
    case 64: return launch_tok<64>(p, s);
    case 128: return launch_tok<128>(p, s);
    case 256: return launch_tok<256>(p, s);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace blockfp8::fp4::sm90
