// SM90 (sm_90a only) NVFP4 W4A16 wgmma GEMM: instantiations and launchers (the kernel: w4a16_wgmma.cuh, which
// opens with the math, the layouts and what is unsupported). Compiled only when the build has 9.0a.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "../../common/vector_rows.h"
#include "kernels.h"
#include "w4a16_wgmma.cuh"

namespace blockfp8::fp4::sm90 {
namespace {

constexpr int64_t kMaxGridY = 65535;  // grid.y holds the 128-row tiles
constexpr int kMaxSplits = 16;        // also the largest (non-portable) cluster SM90 launches
constexpr int kMinStagesPerSplit = 8;  // 512 of K: the ring fills before a split ends
constexpr int kMaxDevices = 64;

// Experiment switches, read once (library.py checks their values at import; fp4/NOTES.md has what they measured):
// BLOCKFP8_SM90_FP4_REDUCTION=cluster / partials restricts the rule's K splits to one reduction (default: the cheaper
// of the two per problem); BLOCKFP8_SM90_FP4_SPLITS=N forces N splits on every launch (a cluster unless partials are
// asked for; the largest launchable cluster <= N).
enum class Reduction { kAuto, kCluster, kPartials };
struct SplitOptions {
  Reduction reduction = Reduction::kAuto;
  int count = 0;  // 0: the rule's
};
const SplitOptions& split_options() {
  static const SplitOptions o = [] {
    SplitOptions r;
    if (const char* v = std::getenv("BLOCKFP8_SM90_FP4_REDUCTION"); v && *v)
      r.reduction = std::strcmp(v, "partials") == 0  ? Reduction::kPartials
                    : std::strcmp(v, "cluster") == 0 ? Reduction::kCluster
                                                     : Reduction::kAuto;
    if (const char* v = std::getenv("BLOCKFP8_SM90_FP4_SPLITS"); v && *v)
      r.count = std::clamp(std::atoi(v), 0, kMaxSplits);
    return r;
  }();
  return o;
}

// The 256-token tile's K-split costs in microseconds, fitted by least squares (weights 1 / time) to the 225 timings of
// the 15 benchmark layers at M = 256 on an H100, each under both reductions with 1, 2, 3, 4, 6 and 8 splits forced
// and the rule's own count (within 5% rms; fp4/NOTES.md): one 64-deep stage of a CTA, per wave; a wave's fixed cost
// (ring fill, epilogue); one MB of fp32 partials written plus one read back by the reduce kernel; a cluster's in-kernel
// sum, per wave.
struct SplitCosts {
  double stage, wave, partial_mb, cluster_wave;
};
constexpr SplitCosts kTok256Costs{0.75, 6.3, 0.18, 1.9};
// The 128-token tile past M = 128 (2 CTAs per SM), fitted the same way to 495 timings of the 128x128 row forced on the
// 15 layers at M = 192, 256 and 384 on an H100, both reductions with 1, 2, 3, 4, 6 and 8 splits (12% rms): it picks
// that tile's reduction and count there, and the 128x128 row takes M = 129..511 where its least time is below the
// 256-token tile's (fp4/NOTES.md).
constexpr SplitCosts kTok128Costs{0.633, 0.35, 0.38, 6.3};

// How a launch splits K: `count` CTAs share each output tile's stages; `cluster`: they are one thread-block cluster
// and sum through distributed shared memory in the kernel, else they write fp32 partials the caller reduces.
struct Split {
  int count = 1;
  bool cluster = false;
  double modelled_us = 0;  // the cost model's time for the launch (the 256-token tile, and the 128-token one past M =
                           // 128; 0 elsewhere)
};


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
  // The epilogues store 8 (unsplit) or 4 (cluster) output rows at once (the op's own output is aligned: N % 16 == 0).
  if (reinterpret_cast<uintptr_t>(p.out) % 16 != 0 || p.out_stride % 8 != 0) return "out rows must be 16-byte aligned";
  return rows_16byte_aligned(p.x, p.m, p.x_stride) ? nullptr : kRowsNot16ByteAligned;
}

// The kernel's dynamic shared memory and clusters of up to 16 CTAs, set on every launch, not once per process: the
// attributes are per device (multi-GPU processes).
template <int TOK, typename T>
cudaError_t prepare_t() {
  auto* kernel = &w4a16_wgmma_kernel<TOK, T>;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, WgmmaTile<TOK>::kSmemBytes);
  if (err == cudaSuccess) err = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  return err;
}

template <int TOK, typename T>
cudaLaunchConfig_t launch_config(dim3 grid, cudaStream_t s, cudaLaunchAttribute* cluster, int splits) {
  cudaLaunchConfig_t c = {};
  c.gridDim = grid;
  c.blockDim = dim3(kThreads);
  c.dynamicSmemBytes = WgmmaTile<TOK>::kSmemBytes;
  c.stream = s;
  cluster->id = cudaLaunchAttributeClusterDimension;
  cluster->val.clusterDim.x = 1, cluster->val.clusterDim.y = 1, cluster->val.clusterDim.z = unsigned(splits);
  c.attrs = cluster;
  c.numAttrs = splits > 1 ? 1 : 0;
  return c;
}

// CTAs that run at once in clusters of `splits` (0: such a cluster cannot launch), per device, asked once: a cluster
// needs its CTAs in one GPC, so this is below the tile's CTAs per SM x SMs, by how much the GPU's GPCs decide.
template <int TOK, typename T>
int64_t cluster_slots(int splits) {
  static std::atomic<int> cache[kMaxDevices][kMaxSplits + 1];  // CTAs + 1; 0: not asked yet
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device >= kMaxDevices) return (void)cudaGetLastError(), 0;
  std::atomic<int>& slot = cache[device][splits];
  if (const int known = slot.load(std::memory_order_relaxed); known > 0) return known - 1;
  int clusters = 0;
  cudaLaunchAttribute cluster;
  const cudaLaunchConfig_t c = launch_config<TOK, T>(dim3(1, 1, unsigned(splits)), nullptr, &cluster, splits);
  if (prepare_t<TOK, T>() != cudaSuccess ||
      cudaOccupancyMaxActiveClusters(&clusters, &w4a16_wgmma_kernel<TOK, T>, &c) != cudaSuccess)
    clusters = 0;
  (void)cudaGetLastError();  // a refused size is an answer, not an error of the caller's next launch
  slot.store(clusters * splits + 1, std::memory_order_relaxed);
  return int64_t(clusters) * splits;
}

// K split, s = 1..16 with at least 8 stages per split; waves(s) = ceil(tiles x s / slots), slots the tile's CTAs per
// SM x SMs for partials and, for a cluster, the CTAs that run at once in clusters of s (cluster_slots: 117 for s = 3
// at one CTA per SM on an H100, not 132).
// - 256-token tile, and the 128-token tile past M = 128 (M = 129..511): the reduction and s of least modelled time,
//   kTok256Costs / kTok128Costs:
//     stage x waves x ceil(stages / s) + wave x waves + (partials: partial_mb x 2 x s x M x N x 4 / 1e6;
//                                                        cluster: cluster_wave x waves).
//   Neither reduction wins everywhere: a cluster has no partial traffic (1.2-4.4x the weight's bytes at M = 256 with
//   the partials rule's counts) but fits fewer CTAs at once. Against the partials rule below, the 256-token tile:
//   0.93x the time (geomean), 0.73-1.02x per layer; the 128-token one at M = 192 / 256 / 384, with the tile choice it
//   moves: 0.966 / 0.947 / 0.959x (worst 1.07x; the same leaving each layer out of the fit).
// - 32..128-token tiles up to M = 128: fp32 partials, s minimizing waves x (stages / s + ring fill). Where these
//   tiles' layers are bound by memory the wave model did not predict either reduction's time (13-15% rms; at M = 128
//   the 128-token model's choice lost up to 12% on a layer: fp4/NOTES.md); BLOCKFP8_SM90_FP4_REDUCTION=cluster uses
//   clusters there (with cluster slots).
// The smaller s on a tie; a cluster over partials on a tie.
template <int TOK, typename T>
Split split_t(const Problem& p) {
  const SplitOptions& o = split_options();
  const int64_t tiles = ((p.m + TOK - 1) / TOK) * ((p.n + kRows - 1) / kRows);
  const int64_t slots = int64_t(WgmmaTile<TOK>::kMinBlocks) * p.sm_count;
  if (o.count > 0) {
    int s = o.count;
    const bool partials = o.reduction == Reduction::kPartials;
    while (s > 1 && !partials && cluster_slots<TOK, T>(s) == 0) --s;
    return Split{s, s > 1 && !partials};
  }
  if (tiles == 0) return Split{};
  const int64_t stages = p.k / kStageK;
  const int most = int(std::max<int64_t>(1, std::min<int64_t>(stages / kMinStagesPerSplit, kMaxSplits)));
  auto waves = [&](int s, bool cluster) -> int64_t {  // 0: cannot launch
    const int64_t at_once = s == 1 || !cluster ? slots : cluster_slots<TOK, T>(s);
    return at_once == 0 ? 0 : (tiles * s + at_once - 1) / at_once;
  };
  auto modelled = [&](const SplitCosts& c, int s, bool cluster) {  // < 0: cannot launch
    const int64_t w = waves(s, cluster);
    if (w == 0) return -1.0;
    const double reduce = s == 1    ? 0.0
                          : cluster ? c.cluster_wave * double(w)
                                    : c.partial_mb * 8e-6 * double(s) * double(p.m) * double(p.n);
    return c.stage * double(w * ((stages + s - 1) / s)) + c.wave * double(w) + reduce;
  };
  Split best{};
  if (TOK == 256 || (TOK == 128 && p.m > 128)) {
    const SplitCosts& costs = TOK == 256 ? kTok256Costs : kTok128Costs;
    best.modelled_us = modelled(costs, 1, false);
    for (int s = 2; s <= most; ++s)
      for (int r = 0; r < 2; ++r) {
        const bool cluster = r == 0;
        if (o.reduction != Reduction::kAuto && cluster != (o.reduction == Reduction::kCluster)) continue;
        const double cost = modelled(costs, s, cluster);
        if (cost >= 0 && cost < best.modelled_us) best = Split{s, cluster, cost};
      }
  } else {
    const bool cluster = o.reduction == Reduction::kCluster;
    if (tiles < slots) {
      const int64_t fill = kXStages;
      int64_t best_len = stages + fill, best_waves = 1;  // cost = waves x the length of one split
      for (int s = 2; s <= most; ++s) {
        const int64_t w = waves(s, cluster), len = (stages + s - 1) / s + fill;
        if (w > 0 && w * len < best_waves * best_len) best = Split{s, cluster}, best_waves = w, best_len = len;
      }
    }
  }
  return best;
}

template <int TOK>
Split split_tok(const Problem& p) {
  return p.bf16 ? split_t<TOK, __nv_bfloat16>(p) : split_t<TOK, __half>(p);
}

template <int TOK, typename T>
cudaError_t launch_t(const Problem& p, cudaStream_t s) {
  if (const cudaError_t err = prepare_t<TOK, T>(); err != cudaSuccess) return err;
  const Split split = split_t<TOK, T>(p);
  if (split.count > 1 && !split.cluster && p.workspace == nullptr) return cudaErrorInvalidValue;
  cudaLaunchAttribute cluster;
  const dim3 grid(unsigned((p.m + TOK - 1) / TOK), unsigned((p.n + kRows - 1) / kRows), unsigned(split.count));
  const cudaLaunchConfig_t c = launch_config<TOK, T>(grid, s, &cluster, split.cluster ? split.count : 1);
  float* partials = split.cluster ? nullptr : static_cast<float*>(p.workspace);
  if (const cudaError_t err = cudaLaunchKernelEx(&c, &w4a16_wgmma_kernel<TOK, T>, make_args<T>(p), partials);
      err != cudaSuccess)
    return err;
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

template <int TOK>
WgmmaPlan plan_tok(const Problem& p) {
  const Split split = split_tok<TOK>(p);
  WgmmaPlan plan{split.count, split.cluster, 0, split.modelled_us};
  plan.at_once = !split.cluster ? int64_t(WgmmaTile<TOK>::kMinBlocks) * p.sm_count
                 : p.bf16       ? cluster_slots<TOK, __nv_bfloat16>(split.count)
                                : cluster_slots<TOK, __half>(split.count);
  return plan;
}

WgmmaPlan w4a16_wgmma_plan(int tok, const Problem& p) {
  switch (tok) {
    case 32: return plan_tok<32>(p);
    case 64: return plan_tok<64>(p);
    case 128: return plan_tok<128>(p);
    case 256: return plan_tok<256>(p);
    default: return WgmmaPlan{};
  }
}

bool w4a16_wgmma_tok128_modelled_faster(const Problem& p) {
  const double tok128 = w4a16_wgmma_plan(128, p).modelled_us, tok256 = w4a16_wgmma_plan(256, p).modelled_us;
  return tok128 > 0 && tok256 > 0 && tok128 < tok256;
}

int w4a16_wgmma_partial_splits(int tok, const Problem& p) {
  const WgmmaPlan plan = w4a16_wgmma_plan(tok, p);
  return plan.cluster ? 1 : std::max(plan.splits, 1);
}

size_t w4a16_wgmma_workspace(int tok, const Problem& p) {
  const int splits = w4a16_wgmma_partial_splits(tok, p);
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
