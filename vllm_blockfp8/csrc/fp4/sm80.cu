// Weight-only NVFP4 linear: the tile table and the launchers.
//
//   out[m, n] = global_scale[n] * sum_k x[m, k] * e2m1(b[n, k]) * b_scale[n, k / 16] (+ bias[n])
//
// Layouts: fp4.h. Compiled for every arch the extension builds (8.9, 9.0a, 12.0a): the kernels use
// SM80+ features only (mma.sync, cp.async). This is how Ada and Hopper run NVFP4 (no FP4 tensor
// cores): decode reads half the bytes of FP8, and larger M runs W4A16 on the 16-bit tensor cores.
// Builds with 9.0a add the SM90 wgmma rows (fp4/sm90/, compiled for sm_90a only; BLOCKFP8_HAS_SM90_GEMM):
// their kernels exist only in that unit, and their preconditions take compute capability 9.0 only.
// Unsupported: k % 32 != 0 (every row), k % 128 != 0 on the row-contiguous packings (the mma.sync tensor-core rows;
// the FMA row takes it). The fragment packing (n % 16, k % 64) is read by the GEMV rows, the FMA row and the SM90
// wgmma rows, not by the mma.sync W4A16 rows (the SM89 path, where the layer keeps the paired packing).
#include <algorithm>
#include <cstdint>

#include "../common/vector_rows.h"
#include "dequant.cuh"
#include "fp4.h"
#include "fragment.cuh"
#include "gemv.cuh"
#include "w4a16.cuh"
#ifdef BLOCKFP8_HAS_SM90_GEMM
#include "sm90/kernels.h"
#endif

namespace blockfp8::fp4 {
namespace {

using Launcher = cudaError_t (*)(const Problem&, cudaStream_t);
using Check = const char* (*)(const Problem&);
using Workspace = size_t (*)(const Problem&);

constexpr int64_t kMaxDim = int64_t(1) << 30;  // kernels index with 32-bit ints

const char* shared_rejects(const Problem& p) {
  if (p.m < 0 || p.n < 0 || p.k < 0) return "M, N and K must be >= 0";
  if (p.m >= kMaxDim || p.n >= kMaxDim || p.k >= kMaxDim) return "M, N and K must be below 2^30 (32-bit indexing)";
  if (p.k % 32 != 0) return "K must be a multiple of 32 (16-byte packed weight loads, whole scale groups)";
  if (p.m > 1 && p.x_stride < p.k) return "x_stride must be >= K";
  if (p.m > 1 && p.out_stride < p.n) return "out_stride must be >= N";
  if (reinterpret_cast<uintptr_t>(p.b) % 16 != 0) return "b must be 16-byte aligned";
  if (reinterpret_cast<uintptr_t>(p.b_scale) % 2 != 0) return "b_scale must be 2-byte aligned";
  if (reinterpret_cast<uintptr_t>(p.x) % 2 != 0 || reinterpret_cast<uintptr_t>(p.out) % 2 != 0)
    return "x and out must be 2-byte aligned";
  if (p.packing == Packing::kFragment) {
    if (p.n % kFragRows != 0 || p.k % kFragK != 0)
      return "the fragment packing needs N % 16 == 0 and K % 64 == 0 (16-row tiles, 64-deep stages)";
    if (reinterpret_cast<uintptr_t>(p.b_scale) % 8 != 0) return "b_scale must be 8-byte aligned (a lane group's 8 scales)";
  }
  return nullptr;
}

bool fragment(const Problem& p) { return p.packing == Packing::kFragment; }
bool paired(const Problem& p) { return p.packing == Packing::kPaired; }

const char* accepts_all(const Problem&) { return nullptr; }
size_t no_workspace(const Problem&) { return 0; }

template <int MT>
const char* gemv_mma_rejects(const Problem& p) {
  if (p.m > MT * kMmaTokens) return MT == 1 ? "M > 8: one 8-token mma tile" : "M > 16: two 8-token mma tiles";
  if (fragment(p)) {  // x in 4-byte pieces
    const bool aligned = reinterpret_cast<uintptr_t>(p.x) % 4 == 0 && (p.m <= 1 || p.x_stride % 2 == 0);
    return aligned ? nullptr : "x rows must be 4-byte aligned (data pointer % 4 == 0, x_stride % 2 == 0)";
  }
  if (p.k % kWindow != 0) return "K must be a multiple of 128 (128-wide lane-quad windows)";
  return rows_16byte_aligned(p.x, p.m, p.x_stride) ? nullptr : kRowsNot16ByteAligned;
}

// 8-warp GEMV blocks (4 or 3 resident per SM) beat 16-warp blocks once the grid has enough blocks to
// spread: more than 2 16-row tiles per SM at one token tile (6144 wide on 132 SMs; 4096 wide lost),
// at least 1.5 at two (4096 wide won, 2112 lost).
template <int MT>
const char* gemv_wide_rejects(const Problem& p) {
  const int64_t tiles = (p.n + kMmaRows - 1) / kMmaRows;
  if (MT == 1 ? tiles <= 2 * int64_t(p.sm_count) : 2 * tiles < 3 * int64_t(p.sm_count))
    return "too few 16-row tiles per SM for 8-warp blocks (16-warp blocks are faster)";
  return gemv_mma_rejects<MT>(p);
}

template <int WN, int WM, int NT, int STAGES>
const char* w4a16_rejects(const Problem& p) {
  if (fragment(p)) return "the mma.sync W4A16 rows read ModelOpt's or the paired packing, not the fragment packing";
  if (p.k % kStageK != 0) return "K must be a multiple of 128 (128-wide pipeline stages)";
  if (W4a16Tile<WN, WM, NT, STAGES>::kSmemBytes > p.max_smem)
    return "the tile's pipeline needs more shared memory per block than this GPU has";
  if (reinterpret_cast<uintptr_t>(p.b_scale) % 8 != 0) return "b_scale must be 8-byte aligned (8-byte cp.async)";
  return rows_16byte_aligned(p.x, p.m, p.x_stride) ? nullptr : kRowsNot16ByteAligned;
}

// Fewer than 24 tiles of 128 rows (N < 2944): the 64 x 64 tiles keep more SMs busy (576 and 2112 wide won
// at M = 64 and 1024; 4096 wide lost).
constexpr int64_t kNarrowRowTiles = 24;

const char* w4a16_narrow_rejects(const Problem& p) {
  if (const char* why = w4a16_rejects<2, 2, 4, 3>(p)) return why;
  return (p.n + 127) / 128 >= kNarrowRowTiles ? "N >= 2944: 128-row tiles fill the GPU" : nullptr;
}

// K splits of a W4A16 row: enough blocks for about two per SM where the output tiles alone leave SMs
// idle, with at least 4 stages (512 of K) per split so the pipeline fills, at most 16.
template <int WN, int WM, int NT, int STAGES>
int w4a16_splits(const Problem& p) {
  using Tile = W4a16Tile<WN, WM, NT, STAGES>;
  const int64_t tiles = ((p.m + Tile::kTokens - 1) / Tile::kTokens) * ((p.n + Tile::kRows - 1) / Tile::kRows);
  if (tiles >= p.sm_count || tiles == 0) return 1;
  const int64_t want = (2 * int64_t(p.sm_count) + tiles - 1) / tiles;
  return int(std::max<int64_t>(1, std::min<int64_t>({want, p.k / kStageK / 4, 16})));
}

template <int WN, int WM, int NT, int STAGES>
size_t w4a16_workspace(const Problem& p) {
  const int splits = w4a16_splits<WN, WM, NT, STAGES>(p);
  return splits > 1 ? size_t(splits) * size_t(p.m) * size_t(p.n) * sizeof(float) : 0;
}

template <typename T>
Args<T> args(const Problem& p) {
  return Args<T>{static_cast<const T*>(p.x), p.b, p.b_scale, p.global_scale, p.global_scale_stride,
                 static_cast<const T*>(p.bias),
                 static_cast<T*>(p.out), int(p.m), int(p.n), int(p.k), p.x_stride, p.out_stride};
}


template <int KS, int MT, int CT, int U, int MINB, int ACCS, bool PAIRED, typename T>
void launch_gemv_mma_t(const Problem& p, cudaStream_t s) {
  const unsigned grid = unsigned((p.n + CT * kMmaRows - 1) / (CT * kMmaRows));
  gemv_mma_kernel<KS, MT, CT, U, MINB, ACCS, PAIRED, T><<<grid, 32 * KS, 0, s>>>(args<T>(p));
}

// The fragment packing's GEMV (fragment.cuh) with the row's warps, token tiles and residency: one 16-row tile per
// block, one 16-byte weight load per lane per 64-deep stage, two accumulators per token tile. x straight from L1 in
// 4-byte pieces up to M = 3 (the lane groups share token rows; at M = 1 0.88-1.04x the staged time), staged through
// shared memory above (16-byte aligned x rows; else the 4-byte pieces): at M = 4 direct took 1.06x the paired GEMV's
// time on 4096x12288, staged 0.96x (fp4/NOTES.md).
// BLOCK_X: at M = 1 the block copies x once into shared memory, permuted to a lane's order (fragment.cuh,
// kBlockStaged), always with prefetch, where it takes at most 40 KB (K <= 20480): with the <= 8 KB of partial sums
// under the 48 KB a block gets without an opt-in attribute, and 4 such blocks still fit an SM. On the H100 probe at
// M = 1 it took 0.93-0.97x the time of the direct x loads on all 6 layers, for both GEMV rows (t8 with prefetch only
// there: at M = 2..8 prefetch was mixed on its layers).
constexpr int64_t kFragmentDirectXMaxM = 3;
constexpr int64_t kBlockXMaxBytes = 40 * 1024;

template <int KS, int MT, int MINB, int FRAG_U, bool FRAG_PF, bool BLOCK_X, typename T>
void launch_gemv_fragment_t(const Problem& p, cudaStream_t s) {
  const unsigned grid = unsigned(p.n / kFragRows);
  const bool aligned = rows_16byte_aligned(p.x, p.m, p.x_stride);
  if (p.m > kFragmentDirectXMaxM && aligned) {
    gemv_fragment_kernel<KS, MT, MINB, XPath::kWarpStaged, T, true, FRAG_U, FRAG_PF>
        <<<grid, 32 * KS, 0, s>>>(args<T>(p));
    return;
  }
  if constexpr (BLOCK_X && MT == 1) {
    if (p.m == 1 && aligned && block_x_bytes(p.k) <= kBlockXMaxBytes) {
      gemv_fragment_kernel<KS, MT, MINB, XPath::kBlockStaged, T, true, FRAG_U, true>
          <<<grid, 32 * KS, size_t(block_x_bytes(p.k)), s>>>(args<T>(p));
      return;
    }
  }
  gemv_fragment_kernel<KS, MT, MINB, XPath::kDirect, T, true, FRAG_U, FRAG_PF><<<grid, 32 * KS, 0, s>>>(args<T>(p));
}

// CT, U, ACCS: the paired packing's kernel (gemv.cuh). FRAG_U, FRAG_PF, BLOCK_X: the fragment kernel's stages per load
// group, whether the next group's loads are issued before this group decodes, and x staged once per block at M = 1
// (fragment.cuh).
template <int KS, int MT, int CT, int U, int MINB, int ACCS = 1, int FRAG_U = 1, bool FRAG_PF = false,
          bool BLOCK_X = false>
cudaError_t launch_gemv_mma(const Problem& p, cudaStream_t s) {
  if (fragment(p))
    p.bf16 ? launch_gemv_fragment_t<KS, MT, MINB, FRAG_U, FRAG_PF, BLOCK_X, __nv_bfloat16>(p, s)
           : launch_gemv_fragment_t<KS, MT, MINB, FRAG_U, FRAG_PF, BLOCK_X, __half>(p, s);
  else if (p.bf16)
    paired(p) ? launch_gemv_mma_t<KS, MT, CT, U, MINB, ACCS, true, __nv_bfloat16>(p, s)
              : launch_gemv_mma_t<KS, MT, CT, U, MINB, ACCS, false, __nv_bfloat16>(p, s);
  else
    paired(p) ? launch_gemv_mma_t<KS, MT, CT, U, MINB, ACCS, true, __half>(p, s)
              : launch_gemv_mma_t<KS, MT, CT, U, MINB, ACCS, false, __half>(p, s);
  return cudaGetLastError();
}

// Sums a K split's fp32 partials (p.workspace, [splits][m][n]) into out, with the global scale and the bias.
template <typename T>
void launch_reduce(const Problem& p, int splits, cudaStream_t s) {
  const int64_t total = p.m * p.n;
  const unsigned blocks = unsigned(std::min<int64_t>((total + 255) / 256, 8 * int64_t(p.sm_count)));
  w4a16_reduce_kernel<T><<<blocks, 256, 0, s>>>(args<T>(p), static_cast<const float*>(p.workspace), splits);
}

template <int WN, int WM, int NT, int STAGES, bool PAIRED, typename T>
cudaError_t launch_w4a16_t(const Problem& p, cudaStream_t s) {
  using Tile = W4a16Tile<WN, WM, NT, STAGES>;
  auto* kernel = &w4a16_kernel<WN, WM, NT, STAGES, PAIRED, T>;
  // On every launch, not once per process: the attribute is per device (multi-GPU processes).
  const cudaError_t attr = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSmemBytes);
  if (attr != cudaSuccess) return attr;
  const int splits = w4a16_splits<WN, WM, NT, STAGES>(p);
  if (splits > 1 && p.workspace == nullptr) return cudaErrorInvalidValue;
  const dim3 grid(unsigned((p.m + Tile::kTokens - 1) / Tile::kTokens), unsigned((p.n + Tile::kRows - 1) / Tile::kRows),
                  unsigned(splits));
  kernel<<<grid, Tile::kThreads, Tile::kSmemBytes, s>>>(args<T>(p), static_cast<float*>(p.workspace));
  if (splits > 1) launch_reduce<T>(p, splits, s);
  return cudaGetLastError();
}

constexpr int kFmaTokens = 4;

cudaError_t launch_gemv_fma(const Problem& p, cudaStream_t s) {
  // grid.y strides over M inside the kernel, so capping it at the hardware limit is enough.
  const unsigned grid_m = unsigned(std::min<int64_t>((p.m + kFmaTokens - 1) / kFmaTokens, 65535));
  if (fragment(p)) {  // a warp per 16-row tile
    const dim3 grid(unsigned((p.n / kFragRows + kFmaWarps - 1) / kFmaWarps), grid_m);
    if (p.bf16)
      gemv_fma_fragment_kernel<kFmaTokens, __nv_bfloat16><<<grid, 32 * kFmaWarps, 0, s>>>(args<__nv_bfloat16>(p));
    else
      gemv_fma_fragment_kernel<kFmaTokens, __half><<<grid, 32 * kFmaWarps, 0, s>>>(args<__half>(p));
    return cudaGetLastError();
  }
  const dim3 grid(unsigned((p.n + kFmaWarps - 1) / kFmaWarps), grid_m);
  if (p.bf16 && paired(p))
    gemv_fma_kernel<kFmaTokens, true, __nv_bfloat16><<<grid, 32 * kFmaWarps, 0, s>>>(args<__nv_bfloat16>(p));
  else if (p.bf16)
    gemv_fma_kernel<kFmaTokens, false, __nv_bfloat16><<<grid, 32 * kFmaWarps, 0, s>>>(args<__nv_bfloat16>(p));
  else if (paired(p))
    gemv_fma_kernel<kFmaTokens, true, __half><<<grid, 32 * kFmaWarps, 0, s>>>(args<__half>(p));
  else
    gemv_fma_kernel<kFmaTokens, false, __half><<<grid, 32 * kFmaWarps, 0, s>>>(args<__half>(p));
  return cudaGetLastError();
}

template <int WN, int WM, int NT, int STAGES>
cudaError_t launch_w4a16(const Problem& p, cudaStream_t s) {
  if (p.bf16)
    return paired(p) ? launch_w4a16_t<WN, WM, NT, STAGES, true, __nv_bfloat16>(p, s)
                     : launch_w4a16_t<WN, WM, NT, STAGES, false, __nv_bfloat16>(p, s);
  return paired(p) ? launch_w4a16_t<WN, WM, NT, STAGES, true, __half>(p, s)
                   : launch_w4a16_t<WN, WM, NT, STAGES, false, __half>(p, s);
}

// The dequantize row (dequant.cuh): this launch writes the 16-bit weight [n, k] into the workspace; the op multiplies
// it (cuBLAS through torch: ops.cpp), applies the bias and never calls launch() for anything else of this row.
const char* dequant_rejects(const Problem& p) {
  if (!fragment(p)) return "the dequantize row reads the fragment packing only (the vLLM layer stores it on SM90)";
  if (reinterpret_cast<uintptr_t>(p.workspace) % 16 != 0) return "the workspace must be 16-byte aligned";
  // On a 2-byte aligned x this row's answer was 5% off the reference (H200; the cause was not found), so the rule of
  // the other tensor-core rows holds here too and such an x goes to the FMA row.
  if (!rows_16byte_aligned(p.x, p.m, p.x_stride)) return kRowsNot16ByteAligned;
  if ((p.n / kFragRows) * (p.k / kFragK) / kDequantWarps >= (int64_t(1) << 31)) return "the weight is too large";
  return nullptr;
}

size_t dequant_workspace(const Problem& p) { return size_t(p.n) * size_t(p.k) * 2; }

// The M from which the table dequantizes instead of running the wgmma rows: the dequantize pass costs about a 2-byte
// write per weight, so its share of the time falls as 1 / M (fp4/NOTES.md has the measured crossover).
constexpr int64_t kDequantMinM = 512;

cudaError_t launch_dequant(const Problem& p, cudaStream_t s) {
  const int64_t blocks = (p.n / kFragRows) * (p.k / kFragK);
  const dim3 grid(unsigned((blocks + kDequantWarps - 1) / kDequantWarps));
  if (p.bf16)
    dequant_fragment_kernel<__nv_bfloat16><<<grid, 32 * kDequantWarps, 0, s>>>(
        p.b, p.b_scale, p.global_scale, p.global_scale_stride, static_cast<__nv_bfloat16*>(p.workspace), p.n, p.k);
  else
    dequant_fragment_kernel<__half><<<grid, 32 * kDequantWarps, 0, s>>>(
        p.b, p.b_scale, p.global_scale, p.global_scale_stride, static_cast<__half*>(p.workspace), p.n, p.k);
  return cudaGetLastError();
}

#ifdef BLOCKFP8_HAS_SM90_GEMM
// The SM90 wgmma rows (fp4/sm90/w4a16_wgmma.cuh): 128 weight rows x TOK tokens per tile.
template <int TOK>
const char* wgmma_rejects(const Problem& p) {
  return sm90::w4a16_wgmma_rejects(TOK, p);
}

template <int TOK>
size_t wgmma_workspace(const Problem& p) {
  return sm90::w4a16_wgmma_workspace(TOK, p);
}

// Selection only (a forced GEMV row still runs): at M = 9..16 the two-token-tile GEMV rows yield to the wgmma 128x32
// row, where it takes the problem, on layers of >= 2^25 weights (the GEMV's per-token work grows with the bytes, the
// wgmma row's fixed cost does not) and on K <= 512 (one stage per GEMV warp). Both GEMV rows ask the same question, so
// a problem t16_ks8 yields does not fall to t16. H100, M = 9 / 12 / 16, wgmma 128x32 over the faster GEMV row's time,
// fitted on 22 layers (the benchmark set and held_out_17, which refuted a first "N >= 8192 or K >= 12288" rule on 2 of
// 7): every layer of >= 2^25 weights 0.67-0.97 (gate_up 24576x4096 0.86-0.88, 7168x16384 0.66-0.70), 32768x512 0.63;
// every layer the GEMV wins is below 2^25 (qkv 6144x4096 1.17-1.22, 2112x7168 1.21-1.27); below it the wgmma row also
// wins on 3200x8640 (0.91-0.95) and 8192x2048 (0.96-0.97), which stay on the GEMV.
constexpr int64_t kGemvYieldWeights = int64_t(1) << 25;
const char* gemv_t16_defers(const Problem& p) {
  if (p.m <= kMmaTokens || (p.n * p.k < kGemvYieldWeights && p.k > 512)) return nullptr;
  return wgmma_rejects<32>(p) == nullptr ? "M = 9..16 on a large layer or K <= 512: wgmma 128x32 is faster" : nullptr;
}

// The 128x128 row past its own M = 128 only where the cost models rate it faster than the 128x256 row (fewer padding
// tokens at M = 257..383, two CTAs per SM where 256-token tiles leave a partial wave), each tile at its own best
// reduction and split: 0.965x the partials-only 128x128 model's selection over M = 160..448 (23 layers, H100; fp4/NOTES.md).
const char* wgmma_tok128_defers(const Problem& p) {
  if (p.m <= 128 || sm90::w4a16_wgmma_tok128_modelled_faster(p)) return nullptr;
  return "M > 128 where the cost model rates 128 x 256 tiles faster";
}

template <int TOK>
cudaError_t launch_wgmma(const Problem& p, cudaStream_t s) {
  if (const cudaError_t err = sm90::launch_w4a16_wgmma(TOK, p, s); err != cudaSuccess) return err;
  if (const int splits = sm90::w4a16_wgmma_partial_splits(TOK, p); splits > 1) {
    if (p.bf16)
      launch_reduce<__nv_bfloat16>(p, splits, s);
    else
      launch_reduce<__half>(p, splits, s);
  }
  return cudaGetLastError();
}
#endif

struct Fp4Row {
  TileRow info;
  Check check;  // the row's own precondition, after the checks every row shares
  Launcher launch;
  Workspace workspace = &no_workspace;
  Check defers = &accepts_all;  // selection only: a reason to let a later row take a problem this row accepts
};

#ifdef BLOCKFP8_HAS_SM90_GEMM
constexpr Check kGemvT16Defers = &gemv_t16_defers;
#else
constexpr Check kGemvT16Defers = &accepts_all;
#endif

// Ordered: the first row with max_m >= M whose precondition holds and that does not defer wins. Numbers: H200, CUDA
// graphs, weights rotated past L2, same run (fp4/NOTES.md).
constexpr Fp4Row kRows[] = {
    {{"fp4_gemv_mma_t8_ks8", 8, "decode on wide layers (> 2 16-row tiles per SM): 8-warp blocks, 4 resident per SM, "
                                "2-stage load groups, the next group in flight, at M = 1 x staged once per block; "
                                "gate_up 24576x4096 at M = 1 18.8 us vs 19.8 without prefetch and 21.3 for 1 stage "
                                "(H200), 21.1 vs 21.7 with x from L1 (H100)"},
     &gemv_wide_rejects<1>, &launch_gemv_mma<8, 1, 1, 1, 4, 1, 2, true, true>},
    {{"fp4_gemv_mma_t8", 8, "decode: 16-warp blocks, 2-stage load groups (prefetch lost here: 4096x4096 5.5 us vs "
                            "5.8), at M = 1 x staged once per block with prefetch (5.5 vs 5.9 us, H100); 2.49x the "
                            "floor vs 2.69 for 1 stage (H200, 6 layers, M = 1)"},
     &gemv_mma_rejects<1>, &launch_gemv_mma<16, 1, 1, 1, 2, 2, 2, false, true>},
    {{"fp4_gemv_mma_t16_ks8", 16, "M = 9..16 on layers with >= 1.5 16-row tiles per SM: 8-warp blocks, 3 resident, "
                                  "2-stage load groups; gate_up at M = 16 31.1 us vs 32.7 for 1 stage and 44.1 for "
                                  "16-warp blocks (H200)"},
     &gemv_wide_rejects<2>, &launch_gemv_mma<8, 2, 1, 1, 3, 1, 2>, &no_workspace, kGemvT16Defers},
    {{"fp4_gemv_mma_t16", 16, "M = 9..16: two 8-token tiles per weight read, 16-warp blocks, 2-stage load groups, the "
                              "next group in flight; 4.21x the floor vs 4.42 without prefetch (H200, 6 layers, M = "
                              "12)"},
     &gemv_mma_rejects<2>, &launch_gemv_mma<16, 2, 1, 1, 1, 1, 2, true>, &no_workspace, kGemvT16Defers},
#ifdef BLOCKFP8_HAS_SM90_GEMM
    // SM90 only (compute capability 9.0), the fragment packing only (the layer stores it there); the mma.sync rows
    // below stay the SM89 path and forced rows on SM90.
    {{"fp4_wgmma_128x32", 32, "SM90, M <= 32 (and M = 9..16 where the GEMV rows yield): m64n32k16, no tensor work "
                              "on a 64-token tile's padding, 4-stage x ring (17 KB), 3 blocks per SM, K split where "
                              "the tiles leave SMs idle; 0.77-1.00x the 128 x 64 row's time at M = 17..32 (22 layers, "
                              "H100), 1.06-1.52x at M = 40"},
     &wgmma_rejects<32>, &launch_wgmma<32>, &wgmma_workspace<32>},
    {{"fp4_wgmma_128x64", 64, "SM90, M = 33..64: wgmma on the fragment packing (each lane loads its A fragment, words "
                              "decoded whole), 128 x 64 tiles, 4-stage x ring (33 KB), 2 blocks per SM, K split where "
                              "the tiles leave SMs idle"},
     &wgmma_rejects<64>, &launch_wgmma<64>, &wgmma_workspace<64>},
    {{"fp4_wgmma_128x128", kDequantMinM - 1, "SM90, M = 65..128, and M = 129..511 where its cost model rates it "
                                            "faster than 128 x 256 tiles: 128 x 128 tiles (66 KB, 2 blocks per SM), "
                                            "K split where the tiles leave SMs idle"},
     &wgmma_rejects<128>, &launch_wgmma<128>, &wgmma_workspace<128>, &wgmma_tok128_defers},
    {{"fp4_wgmma_128x256", kDequantMinM - 1, "SM90, M = 129..511: 128 x 256 tiles (m64n256k16, 132 KB, 1 block "
                                            "per SM), K split where the tiles leave SMs idle"},
     &wgmma_rejects<256>, &launch_wgmma<256>, &wgmma_workspace<256>},
#endif
    // Any arch's build (the kernel is SM80+), but only the fragment packing, which the layer stores on SM90 alone.
    {{"fp4_dequant_cublas", kUnboundedM, "M >= 512 on the fragment packing: the weight dequantized to 16 bits (2.56 "
                                         "bytes of traffic per weight), then cuBLAS; 0.90x the 128 x 256 wgmma row's "
                                         "time at M = 512, 0.79x at 1024, 1.11x at 256 (geomeans, 15 layers)"},
     &dequant_rejects, &launch_dequant, &dequant_workspace},
    {{"fp4_w4a16_64x64", kUnboundedM, "narrow layers (< 24 128-row tiles): 64 x 64 tiles fill more SMs; 2112x7168 at "
                                      "M = 1024 187 us vs 263 for 128 x 128"},
     &w4a16_narrow_rejects, &launch_w4a16<2, 2, 4, 3>, &w4a16_workspace<2, 2, 4, 3>},
    {{"fp4_w4a16_128x64", 128, "mid M: 128 x 64 tiles, 2 stages (82 KB, 2 blocks per SM), K split where the tiles "
                               "leave SMs idle"},
     &w4a16_rejects<4, 2, 4, 2>, &launch_w4a16<4, 2, 4, 2>, &w4a16_workspace<4, 2, 4, 2>},
    {{"fp4_w4a16_128x128", kUnboundedM, "large M: 128 x 128 tiles, 3 stages (155 KB: SM90 only); the decode shared by "
                                        "both token warps"},
     &w4a16_rejects<4, 2, 8, 3>, &launch_w4a16<4, 2, 8, 3>, &w4a16_workspace<4, 2, 8, 3>},
    {{"fp4_w4a16_128x64_any", kUnboundedM, "large M where 155 KB of shared memory is not there (SM89, SM120)"},
     &w4a16_rejects<4, 2, 4, 2>, &launch_w4a16<4, 2, 4, 2>, &w4a16_workspace<4, 2, 4, 2>},
    {{"fp4_gemv_fma_anym", kUnboundedM, "any valid problem (K % 32 == 0, x 2-byte aligned): the correctness fallback"},
     &accepts_all, &launch_gemv_fma},
};
constexpr int kNumRows = int(sizeof(kRows) / sizeof(kRows[0]));
constexpr int kDequantRow = row_index(kRows, "fp4_dequant_cublas");
static_assert(kDequantRow >= 0, "the op asks dequantizes() for this row");
static_assert(kRows[kNumRows - 1].info.max_m == kUnboundedM, "the last row must take any M");

}  // namespace

std::string wgmma_plan_json(int tok, const Problem& p) {
#ifdef BLOCKFP8_HAS_SM90_GEMM
  const sm90::WgmmaPlan plan = sm90::w4a16_wgmma_plan(tok, p);
  if (plan.splits == 0) return "{\"error\": \"no wgmma tile with that many tokens (32, 64, 128, 256)\"}";
  return "{\"splits\": " + std::to_string(plan.splits) + ", \"cluster\": " + (plan.cluster ? "true" : "false") +
         ", \"at_once\": " + std::to_string(plan.at_once) + ", \"modelled_us\": " + std::to_string(plan.modelled_us) +
         "}";
#else
  (void)tok, (void)p;
  return "";
#endif
}

Packing layer_packing(int cc, int64_t n, int64_t k) {
#ifdef BLOCKFP8_HAS_SM90_GEMM
  if (cc == 90 && n % kFragRows == 0 && k % kFragK == 0) return Packing::kFragment;
#else
  (void)cc, (void)n, (void)k;
#endif
  return Packing::kPaired;
}

int num_rows() { return kNumRows; }

bool dequantizes(int i) { return i == kDequantRow; }

const TileRow& row(int i) { return kRows[i].info; }

const char* rejects(int i, const Problem& p) {
  if (i < 0 || i >= kNumRows) return "row index out of range";
  if (const char* why = shared_rejects(p)) return why;
  return kRows[i].check(p);
}

size_t workspace_bytes(int i, const Problem& p) {
  if (rejects(i, p) != nullptr) return 0;
  return kRows[i].workspace(p);
}

int select(const Problem& p) {
  return first_row_taking(kRows, kNumRows, p.m, [&](int i) {
    const char* why = rejects(i, p);
    return why != nullptr ? why : kRows[i].defers(p);
  });
}

cudaError_t launch(int i, const Problem& p, cudaStream_t s) {
  if (rejects(i, p) != nullptr) return cudaErrorInvalidValue;
  if (p.m == 0 || p.n == 0) return cudaSuccess;
  if (kRows[i].workspace(p) > 0 && p.workspace == nullptr) return cudaErrorInvalidValue;
  return kRows[i].launch(p, s);
}

}  // namespace blockfp8::fp4
