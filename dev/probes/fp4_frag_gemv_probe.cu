// The NVFP4 decode GEMV on the fragment packing against a plain read of the same bytes (an H100/H200 diagnostic;
// the GEMV is the extension's: vllm_blockfp8/csrc/fp4/fragment.cuh, gemv_fragment_kernel).
//
// Question (fp4/NOTES.md): the GEMV rows take well above the floor (sm80.cu's table). How much of that does a kernel
// that only reads the same bytes the same way (grid, lane mapping, residency) already take, i.e. how much is left
// to the decode and mma between the loads; and what do prefetch (the next load group issued before this one decodes)
// and, at M = 1, x staged once per block in a lane's order instead of 8 4-byte L1 loads per stage buy? (An earlier
// version timed U = 1, 2, 4 stages per load group: U = 2 is the table's.)
//
//   out[m, n] = global_scale[n] * sum_k x[m, k] * e2m1(code[n, k]) * e4m3(scale[n, k / 16])     (bf16 x and out)
//
// Variants, bf16, all on the fragment packing:
//   read_ks8, read_ks16: the GEMV's grid and lane mapping (a block of KS warps per 16-row tile, warp w takes stages
//     w, w + KS, ...), its 16-byte weight load per lane and stage (sm80::load_weight), the lane group's 8-byte scale
//     word and the direct path's x (8 4-byte __ldg per lane and stage, token min(g, M - 1)); two stages' loads are
//     issued before they are folded (xor/add) into one register, which is stored only if it equals a value the fold
//     cannot take, passed at run time (so no load can be dropped). MIN_BLOCKS as the rows they stand beside (4 for
//     KS = 8, 2 for KS = 16); with fewer registers they may hold more blocks per SM than the GEMVs (printed): a
//     ceiling, not a twin. Timed at every M; above M = 3 their x is still the direct path's (each 4-byte load
//     touches up to 8 token rows), not the staged copies the GEMV makes there.
//   <row>_u<U>: sm80.cu's table rows, t8_ks8 (KS 8, MT 1, MIN_BLOCKS 4), t8 (16, 1, 2), t16_ks8 (8, 2, 3), t16
//     (16, 2, 1), at U = 2 (a "_b<B>" suffix: U = 4, B resident blocks per SM instead of the row's); x direct up to
//     M = 3 and staged per warp above (cp.async.ca), as launch_gemv_fragment_t chooses (the probe's x rows are
//     16-byte aligned; the _b3 rows spill on the staged path, used above M = 3 only). A "p" suffix: PREFETCH (the next
//     group's loads issued before this group decodes: two register buffers of U stages). A "_bx" suffix: at M = 1 x
//     copied once per block into shared memory in a lane's order (fragment.cuh, kBlockStaged) instead of the 8 4-byte
//     L1 loads per lane and stage: the question is what those loads and their addresses cost at decode.
//
// Method. Registers, local memory and resident blocks per SM of every kernel are printed first (local memory in
// a GEMV is a spill: a defect). Each GEMV is checked against the fp32 reference at N = 512, K = 1088 and 4160 (17
// and 65 stages: a warp's last group of U stages is partial) and M = 1, 5, 13 where its token tiles hold M (ragged,
// zero and subnormal scales); a failure is printed and the probe exits non-zero before timing. Then CUDA graphs
// over weight copies that together exceed L2 (the median of 25 replays, probe_util.cuh) on Qwen3-8B's four layers
// and two DeepSeek-V3 shapes: the reads at M = 1, 4, 8, 12, 16, the MT = 1 rows at 1, 4, 8, the MT = 2 rows at 12,
// 16. Printed and written as JSON (one record per shape and M: the floor, packed weight + e4m3 scales + x + out
// over the measured copy rate, and each variant's "<name>_us"); at the end, per variant and M, the geomeans over
// the shapes of the time over the floor and over the same-KS read's time.
//
// Build and run (the stage `fp4_frag_gemv_probe` of dev/device/h200_check.sh does this; ~10-15 s after the build):
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
//        dev/probes/fp4_frag_gemv_probe.cu -o probe && ./probe out.json
// The GEMVs' instruction counts per group of U stages need no GPU: build with -cubin -o probe.cubin, then
//   cuobjdump -sass probe.cubin | python dev/ncu/sass_opcode_counts.py --loop --match gemv_fragment
// (--loop finds the loop by its mma instructions: the reads have none.)
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "../../vllm_blockfp8/csrc/fp4/fragment.cuh"
#include "fp4_probe_data.cuh"

namespace probe {

using namespace blockfp8::fp4;
using bf16 = __nv_bfloat16;

// sm80.cu's kFragmentDirectXMaxM: x direct up to this M, staged above.
constexpr int kDirectXMaxM = 3;

// The loads of gemv_fragment_kernel<KS, ...> with x direct and nothing else: two stages in flight per lane. The
// launch passes never = 0 and the fold | 1 is odd, so the store never happens, but the compiler cannot know that.
template <int KS, int MIN_BLOCKS>
__global__ void __launch_bounds__(32 * KS, MIN_BLOCKS)
    frag_read_kernel(const uint8_t* b, const uint8_t* b_scale, const bf16* x, int m, int k, uint32_t* sink,
                     uint32_t never) {
  constexpr int kGroup = 2;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2;
  const int tile = blockIdx.x, stages = k / kFragK;
  const uint4* wp = reinterpret_cast<const uint4*>(b) + (int64_t(tile) * stages + warp) * kFragBlockWords + lane;
  const uint2* sp = reinterpret_cast<const uint2*>(b_scale) + (int64_t(tile) * stages + warp) * kFragScaleWords + g;
  const uint32_t* xp =
      reinterpret_cast<const uint32_t*>(x + int64_t(min(g, m - 1)) * k + warp * kFragK) + (lane & 3);
  uint32_t v = 0;
  // Not unrolled: ptxas would put 4 stages' loads in flight, not 2.
#pragma unroll 1
  for (int left = (stages - warp + KS - 1) / KS; left > 0; left -= kGroup) {
    uint4 w[kGroup];
    uint2 s[kGroup];
    uint32_t xv[kGroup][8];
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      if (u < left) {
        w[u] = blockfp8::sm80::load_weight(wp + u * KS * kFragBlockWords);
        s[u] = __ldg(sp + u * KS * kFragScaleWords);
#pragma unroll
        for (int q = 0; q < 8; ++q) xv[u][q] = __ldg(xp + u * KS * kFragK / 2 + 4 * q);
      } else {
        w[u] = make_uint4(0u, 0u, 0u, 0u), s[u] = make_uint2(0u, 0u);
#pragma unroll
        for (int q = 0; q < 8; ++q) xv[u][q] = 0u;
      }
    }
    wp += kGroup * KS * kFragBlockWords;
    sp += kGroup * KS * kFragScaleWords;
    xp += kGroup * KS * kFragK / 2;
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      v = ((v ^ w[u].x) + w[u].y) ^ ((w[u].z + w[u].w) ^ (s[u].x + s[u].y));
#pragma unroll
      for (int q = 0; q < 8; q += 2) v += xv[u][q] ^ xv[u][q + 1];
    }
  }
  if ((v | 1u) == never) sink[blockIdx.x] = v;
}

using LaunchFn = void (*)(const Operands&, const bf16*, const float*, bf16*, int, int, int, cudaStream_t);

struct Variant {
  const char* name;
  int ks;  // warps per block: the read a GEMV row is compared with
  int mt;  // 8-token tiles (M <= 8 MT); 0: a read, timed at every M
  LaunchFn launch;
  const void* (*kernel)(bool staged);  // for cudaFuncGetAttributes
};

template <int KS, int MINB>
void launch_read(const Operands& o, const bf16* x, const float*, bf16* out, int m, int n, int k, cudaStream_t st) {
  frag_read_kernel<KS, MINB><<<unsigned(n / kFragRows), 32 * KS, 0, st>>>(o.frag, o.frag_x8, x, m, k,
                                                                           reinterpret_cast<uint32_t*>(out), 0u);
}

template <int KS, int MINB>
const void* read_kernel(bool) {
  return reinterpret_cast<const void*>(&frag_read_kernel<KS, MINB>);
}

// A table row (sm80.cu: launch_gemv_fragment_t) with U stages per load group; x staged per warp above M = 3, direct
// up to M = 3 but (BX) at M = 1, staged once per block there (the probe's K all fit the table's 40 KB).
template <int KS, int MT, int MINB, int U, bool PF, bool BX>
void launch_frag(const Operands& o, const bf16* x, const float* gs, bf16* out, int m, int n, int k, cudaStream_t st) {
  const Args<bf16> a{x, o.frag, o.frag_x8, gs, 1, nullptr, out, m, n, k, k, n};
  const unsigned grid = unsigned(n / kFragRows);
  if (m > kDirectXMaxM)
    gemv_fragment_kernel<KS, MT, MINB, XPath::kWarpStaged, bf16, true, U, PF><<<grid, 32 * KS, 0, st>>>(a);
  else if (BX && MT == 1 && m == 1)
    gemv_fragment_kernel<KS, MT, MINB, BX && MT == 1 ? XPath::kBlockStaged : XPath::kDirect, bf16, true, U, PF>
        <<<grid, 32 * KS, size_t(block_x_bytes(k)), st>>>(a);
  else
    gemv_fragment_kernel<KS, MT, MINB, XPath::kDirect, bf16, true, U, PF><<<grid, 32 * KS, 0, st>>>(a);
}

template <int KS, int MT, int MINB, int U, bool PF, bool BX>
const void* frag_kernel(bool staged) {
  constexpr XPath kSmallM = BX && MT == 1 ? XPath::kBlockStaged : XPath::kDirect;
  constexpr XPath kPath[2] = {kSmallM, XPath::kWarpStaged};
  return staged ? reinterpret_cast<const void*>(&gemv_fragment_kernel<KS, MT, MINB, kPath[1], bf16, true, U, PF>)
                : reinterpret_cast<const void*>(&gemv_fragment_kernel<KS, MT, MINB, kPath[0], bf16, true, U, PF>);
}

#define PROBE_READ(KS, MINB) \
  { "read_ks" #KS, KS, 0, &launch_read<KS, MINB>, &read_kernel<KS, MINB> }
#define PROBE_ROW(NAME, KS, MT, MINB, U) \
  { NAME "_u" #U, KS, MT, &launch_frag<KS, MT, MINB, U, false, false>, &frag_kernel<KS, MT, MINB, U, false, false> }
#define PROBE_ROW_PF(NAME, KS, MT, MINB, U) \
  { NAME "_u" #U "p", KS, MT, &launch_frag<KS, MT, MINB, U, true, false>, &frag_kernel<KS, MT, MINB, U, true, false> }
#define PROBE_ROW_BX(NAME, KS, MT, MINB, U, PF, SUFFIX) \
  { NAME "_u" #U SUFFIX, KS, MT, &launch_frag<KS, MT, MINB, U, PF, true>, &frag_kernel<KS, MT, MINB, U, PF, true> }

// The reads first: each point's GEMV times are divided by the read timed just before them.
const Variant kVariants[] = {
    PROBE_READ(8, 4),
    PROBE_READ(16, 2),
    PROBE_ROW("t8_ks8", 8, 1, 4, 2),
    PROBE_ROW_PF("t8_ks8", 8, 1, 4, 2),
    PROBE_ROW_BX("t8_ks8", 8, 1, 4, 2, true, "p_bx"),
    PROBE_ROW_BX("t8_ks8", 8, 1, 4, 2, false, "_bx"),
    PROBE_ROW_BX("t8_ks8", 8, 1, 3, 4, true, "p_bx_b3"),
    PROBE_ROW_BX("t8_ks8", 8, 1, 2, 4, true, "p_bx_b2"),
    PROBE_ROW("t8", 16, 1, 2, 2),
    PROBE_ROW_PF("t8", 16, 1, 2, 2),
    PROBE_ROW_BX("t8", 16, 1, 2, 2, false, "_bx"),
    PROBE_ROW_BX("t8", 16, 1, 2, 2, true, "p_bx"),
    PROBE_ROW_BX("t8", 16, 1, 1, 4, true, "p_bx_b1"),
    PROBE_ROW("t16_ks8", 8, 2, 3, 2),
    PROBE_ROW_PF("t16", 16, 2, 1, 2),
};
constexpr int kNumVariants = int(sizeof(kVariants) / sizeof(kVariants[0]));

#undef PROBE_READ
#undef PROBE_ROW
#undef PROBE_ROW_PF
#undef PROBE_ROW_BX

constexpr int kMs[] = {1, 4, 8, 12, 16};
constexpr int kNumMs = int(sizeof(kMs) / sizeof(kMs[0]));

// Each GEMV row at the M of its class only (MT = 1: M <= 8; MT = 2: M > 8), as the table picks them.
inline bool timed_at(const Variant& v, int m) { return v.mt == 0 || (v.mt == 1 ? m <= 8 : m > 8); }

// Registers, local memory and resident blocks per SM of each kernel (both x paths of each GEMV): MIN_BLOCKS only
// caps the registers, so a kernel with fewer may hold more blocks than its row's MIN_BLOCKS (the reads do).
inline void print_attributes() {
  bool spills = false;
  std::printf("registers, local bytes per thread, resident blocks per SM:\n");
  for (const Variant& v : kVariants) {
    std::printf("  %-12s", v.name);
    for (int staged = 0; staged < (v.mt ? 2 : 1); ++staged) {
      const void* fn = v.kernel(staged != 0);
      cudaFuncAttributes fa;
      CHECK(cudaFuncGetAttributes(&fa, fn));
      int blocks = 0;
      CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, 32 * v.ks, 0));
      std::printf("  %s%3d regs %4zu local %d blocks", v.mt == 0 ? "" : staged ? "staged " : "direct ", fa.numRegs,
                  fa.localSizeBytes, blocks);
      spills = spills || (v.mt != 0 && fa.localSizeBytes != 0);
    }
    std::printf("\n");
  }
  if (spills) std::printf("  a GEMV uses local memory: a spill (a defect)\n");
}

// Every GEMV at K = 1088 and 4160, M = 1, 5, 13 where it fits; false if any fails.
inline bool run_checks(std::mt19937& rng) {
  bool ok = true;
  for (const Variant& v : kVariants) {
    if (v.mt == 0) continue;
    for (int k : {1088, 4160})
      for (int m : {1, 5, 13}) {
        if (m > 8 * v.mt) continue;
        const int n = 512;
        const double worst = check_launch(m, n, k, rng, [&](const Operands& o, const bf16* x, const float* gs,
                                                            bf16* out, cudaStream_t st) {
          v.launch(o, x, gs, out, m, n, k, st);
        });
        std::printf("check %-12s M %2d N %d K %d: worst error / bound %.3f %s\n", v.name, m, n, k, worst,
                    worst <= 1.0 ? "ok" : "FAIL");
        ok = ok && worst <= 1.0;
      }
  }
  return ok;
}

// Geomeans over the shapes: sums of logs and their counts per variant and M.
struct Geomeans {
  double log_floor[kNumVariants][kNumMs] = {}, log_read[kNumVariants][kNumMs] = {};
  int count[kNumVariants][kNumMs] = {};

  void print(const char* title, bool over_read) const {
    std::printf("\n%s\n  %-12s", title, "variant");
    for (int m : kMs) std::printf("   M = %-3d", m);
    std::printf("\n");
    for (int i = 0; i < kNumVariants; ++i) {
      if (over_read && kVariants[i].mt == 0) continue;
      std::printf("  %-12s", kVariants[i].name);
      for (int j = 0; j < kNumMs; ++j) {
        const double s = over_read ? log_read[i][j] : log_floor[i][j];
        if (count[i][j] == 0)
          std::printf("  %8s", "-");
        else
          std::printf("  %8.3f", std::exp(s / count[i][j]));
      }
      std::printf("\n");
    }
  }
};

}  // namespace probe

int main(int argc, char** argv) {
  using namespace probe;
  const char* path = argc > 1 ? argv[1] : "fp4_frag_gemv_probe.json";
  print_attributes();
  std::mt19937 rng(0);
  if (!run_checks(rng)) {
    std::fprintf(stderr, "a GEMV check failed: nothing timed\n");
    return 1;
  }

  cudaStream_t st;
  CHECK(cudaStreamCreate(&st));
  const double rate = copy_rate(st);
  FILE* f = open_json(path, "fp4_frag_gemv_probe", rate, true);
  // Qwen3-8B's qkv, o, gate_up, down; DeepSeek-V3's q_b-like 24576x1536 and a short-K 32768x512.
  const int shapes[][2] = {{6144, 4096}, {4096, 4096}, {24576, 4096}, {4096, 12288}, {24576, 1536}, {32768, 512}};
  Geomeans gm;
  bool first = true;
  for (const auto& shape : shapes) {
    const int n = shape[0], k = shape[1];
    const std::vector<Operands> copies = timing_copies(rng, n, k);
    for (int j = 0; j < kNumMs; ++j) {
      const int m = kMs[j];
      const Point pt(m, n, k, rate);
      std::printf("%6dx%-6d M %2d floor %6.1f us:", n, k, m, pt.floor_us);
      std::fprintf(f, "%s  {\"n\": %d, \"k\": %d, \"m\": %d, \"floor_us\": %.3f", first ? "" : ",\n", n, k, m,
                   pt.floor_us);
      double read_us[17] = {};  // by KS
      for (int i = 0; i < kNumVariants; ++i) {
        const Variant& v = kVariants[i];
        if (!timed_at(v, m)) continue;
        const double us = time_launch(copies, [&](const Operands& o, cudaStream_t s) {
          v.launch(o, pt.x, pt.gs, pt.out, m, n, k, s);
        });
        record(f, v.name, us, pt.floor_us);
        if (v.mt == 0) read_us[v.ks] = us;
        gm.log_floor[i][j] += std::log(us / pt.floor_us);
        gm.log_read[i][j] += std::log(us / read_us[v.ks]);
        ++gm.count[i][j];
      }
      std::printf("\n");
      std::fprintf(f, "}");
      first = false;
    }
    for (auto& o : copies) free_operands(o);
  }
  gm.print("geomean over the shapes: time / floor", false);
  gm.print("geomean over the shapes: time / the same-KS read's time", true);
  return close_json(f, true);
}
