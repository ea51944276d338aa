// The NVFP4 decode GEMV on the fragment packing (an H200 diagnostic; not part of the extension).
//
// Question (fp4/NOTES.md, "Next: the fragment packing for the whole layer"): the wgmma GEMM runs 0.50-0.85x its
// time on a weight packed in the A fragment's order (fp4_fragment_probe.cu), but the layer holds one copy of the
// weight and the decode GEMV (M = 1-16) reads it too. Does a GEMV on the fragment packing keep today's speed?
//
//   out[m, n] = global_scale[n] * sum_k x[m, k] * e2m1(code[n, k]) * e4m3(scale[n, k / 16])     (bf16 x and out)
//
// The mma.sync m16n8k16 A fragment is the wgmma A fragment of one warp (vllm_blockfp8/csrc/fp4/sm90/wgmma.cuh), so
// lane (g, t)'s 16 bytes of a (16-row tile, 64-deep stage) in the fragment packing (fp4_probe_data.cuh) are its A
// registers for the stage's 4 k16 steps: word kk decodes (decode_paired) to a[0..3] = (row g, k 2t..), (g + 8, 2t..),
// (g, 2t + 8..), (g + 8, 2t + 8..) at k = 64 s + 16 kk. The catch is x: the B fragment of step kk is x[token g] at
// k 2t, 2t + 1 and 2t + 8, 2t + 9, so a lane takes 8 4-byte pieces of x per stage (every 4th pair), where today's
// GEMV (row-contiguous paired packing, gemv.cuh) takes 2 16-byte loads: the K order inside a lane is fixed by the
// packing, and the packing is fixed by the GEMM's x layout in shared memory. The pieces come from L1 (x is small and
// every warp of the GPU re-reads it); the weight bypasses L1 as in the product.
//
// Kernel: a block of KS warps owns one 16-row tile; warp w takes stages w, w + KS, ... (one 512-byte contiguous load
// per warp per stage), U stages' loads issued before their math; MT 8-token tiles (M <= 8 MT); partial tiles summed
// through shared memory in a fixed order, then global scale * 2^7 (kUnbias), one bf16 rounding. Scales as e4m3
// (0.5625 bytes per weight, today's bytes), pre-converted bf16 (+0.0625: 11% more bytes for no conversion) or exp8
// (today's bytes, 3 instructions per two scales: fp4_frag_scales.cuh).
// Tokens past M re-read token M - 1 (never stored). N % 16 == 0, K % 64 == 0.
//
// Side by side in one run, bf16, CUDA graphs over weight copies that do not fit L2: today's product GEMV rows on the
// paired packing (gemv_mma_kernel with the table's parameters: t8_ks8, t8, t16_ks8, t16) and the fragment GEMV
// (KS = 8 and 16; e4m3, bf16 and exp8 scales) on Qwen3-8B's four layers and two DeepSeek-V3 shapes at M = 1, 4, 8, 16.
// Each is first checked against the fp32 reference at M = 1, 5, 13 (ragged, zero and subnormal scales). Printed
// and written as JSON: us and x the floor (packed weight + e4m3 scales + x + out over the measured copy rate).
//
// Build and run (the H200 stage `fp4_frag_gemv_probe` of dev/device/h200_check.sh does this):
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
//        dev/probes/fp4_frag_gemv_probe.cu -o probe && ./probe out.json
// The instruction count needs no GPU: add -cubin, then
//   cuobjdump -sass probe.cubin | python dev/ncu/sass_opcode_counts.py --loop --match "gemv"
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "../../vllm_blockfp8/csrc/fp4/gemv.cuh"
#include "fp4_frag_scales.cuh"
#include "fp4_probe_data.cuh"

namespace probe {

using namespace blockfp8::fp4;
using bf16 = __nv_bfloat16;

constexpr int kStageK = 64;

template <int KS, int MT, int U, int MIN_BLOCKS, Scales S>
__global__ void __launch_bounds__(32 * KS, MIN_BLOCKS)
    frag_gemv_kernel(const bf16* __restrict__ x, const uint4* __restrict__ w_frag, const void* __restrict__ s_frag,
                     const float* __restrict__ global_scale, bf16* __restrict__ out, int m, int n, int k) {
  __shared__ float partial[KS][MT * 4][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int tile = blockIdx.x, stages = k / kStageK;
  // This lane's 16 bytes and its group's scales of (tile, stage warp); a warp's next stage is KS stages further.
  const uint4* wp = w_frag + (int64_t(tile) * stages + warp) * 32 + lane;
  const ScaleVec<S>* sp = static_cast<const ScaleVec<S>*>(s_frag) + (int64_t(tile) * stages + warp) * 8 + g;
  // x of token mt * 8 + g as 4-byte pairs, at pair t of the stage: step kk's pieces are pairs 8 kk + t and 8 kk + t + 4.
  const uint32_t* xp[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
    xp[mt] = reinterpret_cast<const uint32_t*>(x + int64_t(min(mt * kMmaTokens + g, m - 1)) * k + warp * kStageK) + t;

  float acc[MT][2][4] = {};  // two accumulators per token tile: consecutive steps do not wait on each other
  for (int left = (stages - warp + KS - 1) / KS; left > 0; left -= U) {
    uint4 w[U];
    ScaleVec<S> sv[U];
    uint32_t b[U][MT][8];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (u < left) {
        w[u] = sm80::load_weight(wp + u * KS * 32);
        sv[u] = load_scales<S>(sp, u * KS * 8);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int q = 0; q < 8; ++q) b[u][mt][q] = __ldg(xp[mt] + u * KS * 32 + 4 * q);
      }
    }
    wp += U * KS * 32;
    sp += U * KS * 8;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) xp[mt] += U * KS * 32;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (u >= left) break;
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        uint32_t f[4];
        fragment_step<S>(w[u], sv[u], kk, f);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          float* d = acc[mt][kk & 1];
          sm80::mma16816<bf16>(d[0], d[1], d[2], d[3], f[0], f[1], f[2], f[3], b[u][mt][2 * kk],
                               b[u][mt][2 * kk + 1]);
        }
      }
    }
  }

#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < 4; ++i) partial[warp][mt * 4 + i][lane] = acc[mt][0][i] + acc[mt][1][i];
  __syncthreads();
  for (int e = threadIdx.x; e < MT * 4 * 32; e += 32 * KS) {
    const int slot = e >> 5, ln = e & 31;
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < KS; ++w) sum += partial[w][slot][ln];
    // Accumulator element i of lane ln: row g (+8 for i >= 2), token 2t + (i & 1).
    const int mt = slot / 4, i = slot & 3;
    const int col = tile * kMmaRows + (ln >> 2) + (i >= 2 ? 8 : 0);
    const int tok = mt * kMmaTokens + 2 * (ln & 3) + (i & 1);
    if (tok < m) out[int64_t(tok) * n + col] = __float2bfloat16(sum * global_scale[col] * kUnbias);
  }
}

// ---- launching and timing ----------------------------------------------------------------------------------------

struct Variant {
  const char* name;
  int max_m;  // the tokens its token tiles hold
  void (*launch)(const Operands&, const bf16*, const float*, bf16*, int, int, int, cudaStream_t);
};

// Today's product rows (sm80.cu's table: KS, MT, CT, U, MIN_BLOCKS, ACCS) on the paired packing.
template <int KS, int MT, int MINB, int ACCS>
void launch_today(const Operands& o, const bf16* x, const float* gs, bf16* out, int m, int n, int k, cudaStream_t st) {
  const Args<bf16> a{x, o.paired, o.scales, gs, 1, nullptr, out, m, n, k, k, n};
  gemv_mma_kernel<KS, MT, 1, 1, MINB, ACCS, true, bf16><<<unsigned(n / kMmaRows), 32 * KS, 0, st>>>(a);
}

template <int KS, int MT, int U, int MINB, Scales S>
void launch_frag(const Operands& o, const bf16* x, const float* gs, bf16* out, int m, int n, int k, cudaStream_t st) {
  const uint8_t* codes = S == Scales::kExp8 ? o.frag_z : o.frag;
  const uint8_t* scales = S == Scales::kE4m3 ? o.frag_s8 : S == Scales::kBf16 ? o.frag_s16 : o.frag_x8;
  frag_gemv_kernel<KS, MT, U, MINB, S><<<unsigned(n / kMmaRows), 32 * KS, 0, st>>>(
      x, reinterpret_cast<const uint4*>(codes), scales, gs, out, m, n, k);
}

const Variant kVariants[] = {
    {"today_t8_ks8", 8, &launch_today<8, 1, 4, 1>},
    {"today_t8", 8, &launch_today<16, 1, 2, 2>},
    {"frag_t8_ks8_e4m3", 8, &launch_frag<8, 1, 1, 4, Scales::kE4m3>},
    {"frag_t8_ks8_bf16", 8, &launch_frag<8, 1, 1, 4, Scales::kBf16>},
    {"frag_t8_ks8_exp8", 8, &launch_frag<8, 1, 1, 4, Scales::kExp8>},
    {"frag_t8_ks16_exp8", 8, &launch_frag<16, 1, 2, 2, Scales::kExp8>},
    {"today_t16_ks8", 16, &launch_today<8, 2, 3, 1>},
    {"today_t16", 16, &launch_today<16, 2, 1, 1>},
    {"frag_t16_ks8_e4m3", 16, &launch_frag<8, 2, 1, 3, Scales::kE4m3>},
    {"frag_t16_ks8_exp8", 16, &launch_frag<8, 2, 1, 3, Scales::kExp8>},
};

}  // namespace probe

int main(int argc, char** argv) {
  using namespace probe;
  const char* path = argc > 1 ? argv[1] : "fp4_frag_gemv_probe.json";
  std::mt19937 rng(0);
  bool ok = true;
  for (const Variant& v : kVariants)
    for (int m : {1, 5, 13}) {
      if (m > v.max_m) continue;
      const double worst = check_launch(m, 512, 1024, rng, [&](const Operands& o, const bf16* x, const float* gs,
                                                               bf16* out, cudaStream_t st) {
        v.launch(o, x, gs, out, m, 512, 1024, st);
      });
      std::printf("check %-18s M %2d N 512 K 1024: worst error / bound %.3f %s\n", v.name, m, worst,
                  worst <= 1.0 ? "ok" : "FAIL");
      ok = ok && worst <= 1.0;
    }

  cudaStream_t st;
  CHECK(cudaStreamCreate(&st));
  const double rate = copy_rate(st);
  FILE* f = open_json(path, "fp4_frag_gemv_probe", rate, ok);
  // Qwen3-8B's qkv, o, gate_up, down; DeepSeek-V3's q_b-like 24576x1536 and a short-K 32768x512.
  const int shapes[][2] = {{6144, 4096}, {4096, 4096}, {24576, 4096}, {4096, 12288}, {24576, 1536}, {32768, 512}};
  bool first = true;
  for (const auto& shape : shapes) {
    const int n = shape[0], k = shape[1];
    const std::vector<Operands> copies = timing_copies(rng, n, k);
    for (int m : {1, 4, 8, 16}) {
      const Point pt(m, n, k, rate);
      std::printf("%6dx%-6d M %2d floor %6.1f us:", n, k, m, pt.floor_us);
      std::fprintf(f, "%s  {\"n\": %d, \"k\": %d, \"m\": %d, \"floor_us\": %.3f", first ? "" : ",\n", n, k, m,
                   pt.floor_us);
      for (const Variant& v : kVariants) {
        if (m > v.max_m || (v.max_m == 16 && m <= 8)) continue;  // each M against the rows of its class
        const double us = time_launch(copies, [&](const Operands& o, cudaStream_t s) {
          v.launch(o, pt.x, pt.gs, pt.out, m, n, k, s);
        });
        record(f, v.name, us, pt.floor_us);
      }
      std::printf("\n");
      std::fprintf(f, "}");
      first = false;
    }
    for (auto& o : copies) free_operands(o);
  }
  return close_json(f, ok);
}
