// Programmatic dependent launch (PDL) in front of the NVFP4 decode GEMV (an H100/H200 diagnostic for issue 50 item 2
// and the small layers of issue 49; the GEMV is the extension's: vllm_blockfp8/csrc/fp4/fragment.cuh).
//
// Question: in a batch-1 decode step every GEMV follows a short kernel (vLLM's RMSNorm: one block per token, ~2 us),
// and a GEMV on a 4096-wide layer takes 1.5-1.9x its floor even alone, much of it a fixed cost (launch, ramp, the
// first DRAM round trip: fp4/NOTES.md). How much of a [norm, GEMV] pair's time does PDL hide, with the GEMV's first
// weight loads issued before griddepcontrol.wait (its weights do not depend on the norm; its x does)?
//
// Kernels, bf16, M = 1, the fragment packing:
//   norm: a one-block stand-in for vLLM's rms_norm at one token (1024 threads: sum of squares, block reduction,
//     x_out = x_in * rsqrt(mean + eps)); normtrig issues griddepcontrol.launch_dependents first (vLLM's norm does not:
//     the ceiling of what a producer-side trigger would add).
//   gemv: the table's row as launch_gemv_fragment_t runs it at M = 1 (t8_ks8 where 16-row tiles > 2 per SM, else t8;
//     x staged per block, U = 2, prefetch). It has no griddepcontrol.wait, so gemv_pdl (launched with PDL) may read
//     x before the norm wrote it: a timing ceiling, not a correct pair.
//   read / read_pdl: the GEMV's loads alone (fp4_frag_gemv_probe.cu's read: KS = 8, 4 blocks per SM, two stages per
//     load group, the next group issued before this one is folded), read_pdl with griddepcontrol.wait after the first
//     group's weight and scale loads and before any x load: the pattern a PDL GEMV would have, and correct.
// Timed: each kernel alone, and pairs [norm, consumer] in a CUDA graph that walks weight copies past L2
// (probe_util.cuh, the median of 25 replays, per pair), on Qwen3-8B's four layers. Printed and written as JSON: per
// layer the floor (fp4_probe_data.cuh's Point) and each variant's "<name>_us"; "hidden" = (norm alone + consumer
// alone) - pair.
//
// Build and run (no extension build needed; ~10 s after nvcc):
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
//        dev/probes/pdl_gemv_probe.cu -o pdl_probe && ./pdl_probe out.json
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "../../vllm_blockfp8/csrc/fp4/fragment.cuh"
#include "fp4_probe_data.cuh"

namespace probe {

using namespace blockfp8::fp4;
using bf16 = __nv_bfloat16;

template <bool TRIGGER>
__global__ void __launch_bounds__(1024) norm_kernel(const bf16* x_in, bf16* x_out, int k) {
  if constexpr (TRIGGER) asm volatile("griddepcontrol.launch_dependents;");
  __shared__ float warp_sums[32];
  float ss = 0.f;
  for (int i = threadIdx.x; i < k; i += blockDim.x) {
    const float v = __bfloat162float(x_in[i]);
    ss += v * v;
  }
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    ss = threadIdx.x < (blockDim.x >> 5) ? warp_sums[threadIdx.x] : 0.f;
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (threadIdx.x == 0) warp_sums[0] = ss;
  }
  __syncthreads();
  const float r = rsqrtf(warp_sums[0] / float(k) + 1e-6f);
  for (int i = threadIdx.x; i < k; i += blockDim.x) x_out[i] = __float2bfloat16(__bfloat162float(x_in[i]) * r);
}

// The GEMV's loads at M = 1, folded into one register that is stored only if it equals `never` (the launch passes 0;
// the fold | 1 is odd), so no load can be dropped.
template <bool WAIT>
__global__ void __launch_bounds__(256, 4)
    read_kernel(const uint8_t* b, const uint8_t* b_scale, const bf16* x, int k, uint32_t* sink, uint32_t never) {
  constexpr int KS = 8, kGroup = 2;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2;
  const int stages = k / kFragK;
  const int64_t block = int64_t(blockIdx.x) * stages + warp;  // this warp's first (tile, stage) block
  const uint4* wp = reinterpret_cast<const uint4*>(b) + block * kFragBlockWords + lane;
  const uint2* sp = reinterpret_cast<const uint2*>(b_scale) + block * kFragScaleWords + g;
  const uint32_t* xp = reinterpret_cast<const uint32_t*>(x + warp * kFragK) + (lane & 3);
  uint4 w[kGroup];
  uint2 s[kGroup];
  auto load_group = [&](int left) {
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      w[u] = u < left ? blockfp8::sm80::load_weight(wp + u * KS * kFragBlockWords) : make_uint4(0u, 0u, 0u, 0u);
      s[u] = u < left ? __ldg(sp + u * KS * kFragScaleWords) : make_uint2(0u, 0u);
    }
    wp += kGroup * KS * kFragBlockWords;
    sp += kGroup * KS * kFragScaleWords;
  };
  int left = (stages - warp + KS - 1) / KS;
  load_group(left);
  if constexpr (WAIT) asm volatile("griddepcontrol.wait;" ::: "memory");
  uint32_t v = 0;
#pragma unroll 1
  for (; left > 0; left -= kGroup) {
    uint32_t xv[kGroup][8];
#pragma unroll
    for (int u = 0; u < kGroup; ++u)
#pragma unroll
      for (int q = 0; q < 8; ++q) xv[u][q] = u < left ? __ldg(xp + u * KS * kFragK / 2 + 4 * q) : 0u;
    xp += kGroup * KS * kFragK / 2;
    const uint4 w0 = w[0], w1 = w[1];
    const uint2 s0 = s[0], s1 = s[1];
    load_group(left - kGroup);  // the next group in flight while this one is folded
    v = ((v ^ w0.x) + w0.y) ^ ((w0.z + w0.w) ^ (s0.x + s0.y));
    v = ((v ^ w1.x) + w1.y) ^ ((w1.z + w1.w) ^ (s1.x + s1.y));
#pragma unroll
    for (int u = 0; u < kGroup; ++u)
#pragma unroll
      for (int q = 0; q < 8; q += 2) v += xv[u][q] ^ xv[u][q + 1];
  }
  if ((v | 1u) == never) sink[blockIdx.x] = v;
}

// cudaLaunchKernelEx with programmatic stream serialization on or off.
template <typename... Params, typename... Args>
void launch(bool pdl, void (*kernel)(Params...), unsigned grid, unsigned block, size_t smem, cudaStream_t st,
            Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(block);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = pdl ? 1 : 0;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

// What one graph node of a variant launches after (or without) the norm.
enum class Consumer { kNone, kGemv, kRead };

struct Variant {
  const char* name;
  int norm;  // 0: none, 1: norm, 2: normtrig
  Consumer consumer;
  bool pdl;  // the consumer launched with PDL (read: the WAIT kernel)
};

const Variant kVariants[] = {
    {"norm", 1, Consumer::kNone, false},
    {"gemv", 0, Consumer::kGemv, false},
    {"read", 0, Consumer::kRead, false},
    {"norm_gemv", 1, Consumer::kGemv, false},
    {"norm_gemv_pdl", 1, Consumer::kGemv, true},
    {"norm_read", 1, Consumer::kRead, false},
    {"norm_read_pdl", 1, Consumer::kRead, true},
    {"normtrig_read_pdl", 2, Consumer::kRead, true},
};

// The table's GEMV row at M = 1 (sm80.cu: t8_ks8 where 16-row tiles > 2 per SM, else t8; block-staged x, U = 2,
// prefetch).
void launch_gemv(bool pdl, const Args<bf16>& a, int sms, cudaStream_t st) {
  const unsigned grid = unsigned(a.n / kFragRows);
  const size_t smem = size_t(block_x_bytes(a.k));
  if (a.n / kFragRows > 2 * sms)
    launch(pdl, &gemv_fragment_kernel<8, 1, 4, XPath::kBlockStaged, bf16, true, 2, true>, grid, 256, smem, st, a);
  else
    launch(pdl, &gemv_fragment_kernel<16, 1, 2, XPath::kBlockStaged, bf16, true, 2, true>, grid, 512, smem, st, a);
}

}  // namespace probe

int main(int argc, char** argv) {
  using namespace probe;
  const char* path = argc > 1 ? argv[1] : "pdl_gemv_probe.json";
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::mt19937 rng(0);
  cudaStream_t st;
  CHECK(cudaStreamCreate(&st));
  const double rate = copy_rate(st);
  FILE* f = open_json(path, "pdl_gemv_probe", rate, true);
  const int shapes[][2] = {{6144, 4096}, {4096, 4096}, {24576, 4096}, {4096, 12288}};
  bool first = true;
  for (const auto& shape : shapes) {
    const int n = shape[0], k = shape[1];
    const std::vector<Operands> copies = timing_copies(rng, n, k);
    const Point pt(1, n, k, rate);
    bf16* x_out;
    uint32_t* sink;
    CHECK(cudaMalloc(&x_out, size_t(k) * 2));
    CHECK(cudaMemcpy(x_out, pt.x, size_t(k) * 2, cudaMemcpyDeviceToDevice));
    CHECK(cudaMalloc(&sink, size_t(n / kFragRows) * 4));
    std::printf("%6dx%-6d floor %5.1f us:", n, k, pt.floor_us);
    std::fprintf(f, "%s  {\"n\": %d, \"k\": %d, \"m\": 1, \"floor_us\": %.3f", first ? "" : ",\n", n, k, pt.floor_us);
    double alone[3] = {};  // norm, gemv, read
    for (const Variant& v : kVariants) {
      const double us = time_launch(copies, [&](const Operands& o, cudaStream_t s) {
        if (v.norm == 1) launch(false, &norm_kernel<false>, 1, 1024, 0, s, pt.x, x_out, k);
        if (v.norm == 2) launch(false, &norm_kernel<true>, 1, 1024, 0, s, pt.x, x_out, k);
        const bf16* x = v.norm ? x_out : pt.x;
        const Args<bf16> a{x, o.frag, o.frag_x8, pt.gs, 1, nullptr, pt.out, 1, n, k, k, n};
        if (v.consumer == Consumer::kGemv) launch_gemv(v.pdl, a, prop.multiProcessorCount, s);
        if (v.consumer == Consumer::kRead) {
          const uint8_t *b = o.frag, *bs = o.frag_x8;
          if (v.pdl)
            launch(true, &read_kernel<true>, unsigned(n / kFragRows), 256, 0, s, b, bs, x, k, sink, 0u);
          else
            launch(false, &read_kernel<false>, unsigned(n / kFragRows), 256, 0, s, b, bs, x, k, sink, 0u);
        }
      });
      record(f, v.name, us, pt.floor_us);
      if (v.consumer == Consumer::kNone) alone[0] = us;
      if (v.norm == 0) alone[v.consumer == Consumer::kGemv ? 1 : 2] = us;
      if (v.norm != 0 && v.consumer != Consumer::kNone) {
        const double hidden = alone[0] + alone[v.consumer == Consumer::kGemv ? 1 : 2] - us;
        std::printf(" [hidden %.2f]", hidden);
        std::fprintf(f, ", \"%s_hidden_us\": %.3f", v.name, hidden);
      }
    }
    std::printf("\n");
    std::fprintf(f, "}");
    first = false;
    CHECK(cudaFree(x_out));
    CHECK(cudaFree(sink));
    for (auto& o : copies) free_operands(o);
  }
  return close_json(f, true);
}
