// The NVFP4 decode GEMV on the fragment packing against the row-contiguous (paired) one (an H100/H200 diagnostic;
// the kernels are the extension's: vllm_blockfp8/csrc/fp4/gemv.cuh and fragment.cuh).
//
// Question (fp4/NOTES.md): the SM90 layer stores the fragment packing (its wgmma GEMM takes 0.49-0.88x the time it
// took on the paired one), so the decode GEMV (M = 1-16) reads it too. Does it keep the paired GEMV's speed at
// every M = 1..16? Staged through shared memory it was 0.94-1.02x (geomean per M) but 1.04-1.12x on the N = 4096
// layers at M = 12-16, with copies that bypass L1 (.cg): does keeping x in L1 (.ca) close that?
//
//   out[m, n] = global_scale[n] * sum_k x[m, k] * e2m1(code[n, k]) * e4m3(scale[n, k / 16])     (bf16 x and out)
//
// The fragment GEMV's B fragment of step kk is x[token g] at k 2t, 2t + 1 and 2t + 8, 2t + 9, so its x comes either
// as 8 4-byte pieces per lane and stage from L1 (`direct`; an earlier run measured it 0.92-1.07x the paired GEMV's
// time at M = 1-4 but 1.06-1.55x at M = 8-16: each piece touches 8 token rows there) or staged through shared
// memory with 16-byte cp.async and taken with ldmatrix (`staged`, what the product runs above M = 4; `staged_cg`
// the same with L2-only copies).
//
// Side by side in one run, bf16, CUDA graphs over weight copies that do not fit L2: each GEMV row of the table
// (t8_ks8, t8, t16_ks8, t16: sm80.cu's warps, token tiles and residency) on the paired packing, and the same
// row's fragment kernel with x direct, staged and staged_cg, on Qwen3-8B's four layers and two DeepSeek-V3 shapes at M = 1, 4,
// 5, 8, 12, 16. Each is first checked against the fp32 reference at M = 1, 5, 13 (ragged, zero and subnormal
// scales). Printed and written as JSON: us and x the floor (packed weight + e4m3 scales + x + out over the measured
// copy rate).
//
// Build and run (the stage `fp4_frag_gemv_probe` of dev/device/h200_check.sh does this):
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

#include "../../vllm_blockfp8/csrc/fp4/fragment.cuh"
#include "../../vllm_blockfp8/csrc/fp4/gemv.cuh"
#include "fp4_probe_data.cuh"

namespace probe {

using namespace blockfp8::fp4;
using bf16 = __nv_bfloat16;

struct Variant {
  const char* name;
  int max_m;  // the tokens its token tiles hold
  void (*launch)(const Operands&, const bf16*, const float*, bf16*, int, int, int, cudaStream_t);
};

// A table row on the paired packing (sm80.cu: KS, MT, MIN_BLOCKS, ACCS; CT = U = 1).
template <int KS, int MT, int MINB, int ACCS>
void launch_paired(const Operands& o, const bf16* x, const float* gs, bf16* out, int m, int n, int k, cudaStream_t st) {
  const Args<bf16> a{x, o.paired, o.scales, gs, 1, nullptr, out, m, n, k, k, n};
  gemv_mma_kernel<KS, MT, 1, 1, MINB, ACCS, true, bf16><<<unsigned(n / kMmaRows), 32 * KS, 0, st>>>(a);
}

// The same row on the fragment packing, x direct (STAGE_X = false) or staged through shared memory, its copies
// kept in L1 (the product) or L2 only (`_cg`).
template <int KS, int MT, int MINB, bool STAGE_X, bool X_VIA_L1 = true>
void launch_fragment(const Operands& o, const bf16* x, const float* gs, bf16* out, int m, int n, int k,
                     cudaStream_t st) {
  const Args<bf16> a{x, o.frag, o.frag_x8, gs, 1, nullptr, out, m, n, k, k, n};
  gemv_fragment_kernel<KS, MT, MINB, STAGE_X, bf16, X_VIA_L1><<<unsigned(n / kFragRows), 32 * KS, 0, st>>>(a);
}

const Variant kVariants[] = {
    {"paired_t8_ks8", 8, &launch_paired<8, 1, 4, 1>},
    {"frag_t8_ks8_direct", 8, &launch_fragment<8, 1, 4, false>},
    {"frag_t8_ks8_staged", 8, &launch_fragment<8, 1, 4, true>},
    {"frag_t8_ks8_staged_cg", 8, &launch_fragment<8, 1, 4, true, false>},
    {"paired_t8", 8, &launch_paired<16, 1, 2, 2>},
    {"frag_t8_direct", 8, &launch_fragment<16, 1, 2, false>},
    {"frag_t8_staged", 8, &launch_fragment<16, 1, 2, true>},
    {"frag_t8_staged_cg", 8, &launch_fragment<16, 1, 2, true, false>},
    {"paired_t16_ks8", 16, &launch_paired<8, 2, 3, 1>},
    {"frag_t16_ks8_direct", 16, &launch_fragment<8, 2, 3, false>},
    {"frag_t16_ks8_staged", 16, &launch_fragment<8, 2, 3, true>},
    {"frag_t16_ks8_staged_cg", 16, &launch_fragment<8, 2, 3, true, false>},
    {"paired_t16", 16, &launch_paired<16, 2, 1, 1>},
    {"frag_t16_direct", 16, &launch_fragment<16, 2, 1, false>},
    {"frag_t16_staged", 16, &launch_fragment<16, 2, 1, true>},
    {"frag_t16_staged_cg", 16, &launch_fragment<16, 2, 1, true, false>},
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
      std::printf("check %-20s M %2d N 512 K 1024: worst error / bound %.3f %s\n", v.name, m, worst,
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
    for (int m : {1, 4, 5, 8, 12, 16}) {
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
