// mma.sync issue-rate probe: the ceiling of the SM89 GEMM rows (csrc/gemm/sm89/) on the GPU it runs on.
//
// Question: how many FP8 FLOPs per clock and SM does `mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32` sustain,
// with nothing else in the loop? bench_sm89 divides the SM89 rows' prefill TFLOP/s by it (their "% of the mma.sync
// peak"). For comparison the bf16 `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32` at the same settings.
//
// On Hopper mma.sync is NOT the fastest tensor-core path: wgmma is (dev/probes/wgmma_rate_probe.cu; the SM90 rows
// and cuBLASLt use it). So on the H200 this measures the ceiling the SM89 rows can reach there, not Ada's rate: an
// L4 or a 4090 has its own mma.sync FP8 rate (and clocks), which only a run on that GPU gives.
//
// Method: one CTA per SM, `warps` warps each; per warp `Chains` independent m16n8 fp32 accumulators, each fed by
// the same register-resident A and B fragments (no loads, no shared memory), `iters` iterations of one mma per
// chain. Chains hide the mma latency (a chain waits on its own previous mma), warps fill the SM's four schedulers.
// Cycles: clock64 around the loop per CTA, the slowest CTA taken. Time: cudaEvents around the whole launch (so the
// TFLOP/s include the launch and the ramp; iters is large enough that they are a small share). The sustained clock
// is cycles / time. Operand values are small and nonzero (no NaN/Inf codes): a tensor core's power, and so the
// clock under a power cap, depends on the data; zeros would flatter it.
//
// Build and run (dev/device/h200_pending.sh does this through dev/probes/mma_fp8_rate.py):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v dev/probes/mma_fp8_rate_probe.cu \
//        -o mma_probe && ./mma_probe out.json [iters]
// (sm_89 as well: -gencode=arch=compute_89,code=sm_89.) The JSON ends with "peak": the best configuration of each
// instruction.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "probe_util.cuh"

enum class Op { kE4m3, kBf16 };

// One mma per call: D = A * B + D, fragments as the PTX ISA lays them out for m16n8k32 (e4m3) / m16n8k16 (bf16):
// A 4 x 32-bit registers, B 2, C/D 4 fp32.
template <Op kOp>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (kOp == Op::kE4m3) {
    asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

template <Op kOp>
constexpr double flops_per_mma() { return kOp == Op::kE4m3 ? 2.0 * 16 * 8 * 32 : 2.0 * 16 * 8 * 16; }

// A nonzero operand word: four e4m3 codes with exponent field 1, 3, 5 or 7 (2^-6 .. 1.875, either sign; the
// largest code is 0x3f / 0xbf, never the NaN code 0x7f), or two bf16 values of magnitude [0.5, 1) with mixed
// signs, varied by lane and register so no path is special.
template <Op kOp>
__device__ __forceinline__ uint32_t operand(int lane, int i) {
  const uint32_t h = uint32_t(lane * 2654435761u + i * 40503u);
  if constexpr (kOp == Op::kE4m3) {
    uint32_t w = 0;
    for (int byte = 0; byte < 4; ++byte) {
      const uint32_t bits = (h >> (8 * byte)) & 0xffu;
      w |= ((bits & 0xb7u) | 0x08u) << (8 * byte);  // sign, odd exponent field, mantissa
    }
    return w;
  } else {
    const uint32_t lo = 0x3f00u | (h & 0x807fu), hi = 0x3f00u | ((h >> 16) & 0x807fu);
    return lo | (hi << 16);
  }
}

// __launch_bounds__(512, 1): up to 16 warps (four per scheduler) at up to 128 registers; 32 warps would cap them at
// 64, and the 8-chain e4m3 variant on sm_90a (its B fragments held converted to f16) spilled there.
// Each chain has its own B fragment and A changes every iteration (two low mantissa bits of one register flipped by
// the iteration count: never a NaN code), so no product repeats: ptxas cannot hoist or share one (on sm_90a it
// expands the e4m3 mma into code it can see through, and without this it computed a loop-invariant product once
// per four iterations). One IMAD and one LOP3 per iteration, shared by the chains.
template <Op kOp, int Chains>
__global__ void __launch_bounds__(512, 1) mma_probe(int iters, long long* cycles, float* sink) {
  const int lane = threadIdx.x % 32;
  uint32_t a[4], b[Chains][2];
#pragma unroll
  for (int i = 0; i < 4; ++i) a[i] = operand<kOp>(lane, i);
#pragma unroll
  for (int c = 0; c < Chains; ++c)
#pragma unroll
    for (int i = 0; i < 2; ++i) b[c][i] = operand<kOp>(lane, 4 + 2 * c + i);
  const uint32_t a0 = a[0];
  const uint32_t flip = kOp == Op::kE4m3 ? 0x03030303u : 0x00030003u;
  float acc[Chains][4];
#pragma unroll
  for (int c = 0; c < Chains; ++c)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[c][j] = 0.f;
  __syncthreads();
  const long long t0 = clock64();
  // Not unrolled: unrolled 4x, ptxas converted four iterations' A ahead on sm_90a and the 8-chain e4m3 variant
  // spilled at 128 registers. The loop's own cost (3 instructions) is shared by the chains.
#pragma unroll 1
  for (int it = 0; it < iters; ++it) {
    a[0] = a0 ^ ((uint32_t(it) * 0x01010101u) & flip);
#pragma unroll
    for (int c = 0; c < Chains; ++c) mma<kOp>(acc[c], a, b[c]);
  }
  __syncthreads();
  const long long t1 = clock64();
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < Chains; ++c) s += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
  if (s == -1.2345f) sink[0] = s;  // never true for this data: keeps every mma live
}

struct Result {
  std::string op;
  int warps, chains;
  double flop_per_clk_sm, tflops, clock_ghz;
};

template <Op kOp, int Chains>
bool run(std::vector<Result>& out, const ProbeDevice& dev, int warps, int iters) {
  const char* op = kOp == Op::kE4m3 ? "e4m3_m16n8k32" : "bf16_m16n8k16";
  auto kernel = mma_probe<kOp, Chains>;
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  kernel<<<dev.sms, 32 * warps>>>(iters / 8, dev.cycles, dev.sink);  // warm-up: clocks up
  cudaEventRecord(start);
  kernel<<<dev.sms, 32 * warps>>>(iters, dev.cycles, dev.sink);
  cudaEventRecord(stop);
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    printf("%-14s warps %2d chains %d: error %s\n", op, warps, Chains, cudaGetErrorString(err));
    return false;
  }
  float ms = 0.f;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  const long long worst = worst_cta_cycles(dev.cycles, dev.sms);
  const double per_sm = flops_per_mma<kOp>() * warps * Chains * double(iters);
  Result r{op, warps, Chains, per_sm / double(worst), per_sm * dev.sms / (ms * 1e-3) / 1e12,
           double(worst) / (ms * 1e-3) / 1e9};
  out.push_back(r);
  printf("%-14s warps %2d chains %d: %7.1f FLOP/clk/SM  %7.1f TFLOP/s  (%.2f GHz sustained)\n", op, warps, Chains,
         r.flop_per_clk_sm, r.tflops, r.clock_ghz);
  return true;
}

template <Op kOp>
bool sweep(std::vector<Result>& out, const ProbeDevice& dev, int iters) {
  bool ok = true;
  for (int warps : {4, 8, 16}) {
    ok &= run<kOp, 1>(out, dev, warps, iters);
    ok &= run<kOp, 2>(out, dev, warps, iters);
    ok &= run<kOp, 4>(out, dev, warps, iters);
    ok &= run<kOp, 8>(out, dev, warps, iters);
  }
  return ok;
}

const Result* best(const std::vector<Result>& out, const char* op) {
  const Result* b = nullptr;
  for (const Result& r : out)
    if (r.op == op && (b == nullptr || r.tflops > b->tflops)) b = &r;
  return b;
}

void write_peak(FILE* f, const char* key, const Result* r, bool comma) {
  fprintf(f, "  \"%s\": {\"tflops\": %.2f, \"flop_per_clk_sm\": %.1f, \"clock_ghz\": %.3f, \"warps\": %d, \"chains\": %d}%s\n",
          key, r->tflops, r->flop_per_clk_sm, r->clock_ghz, r->warps, r->chains, comma ? "," : "");
}

int main(int argc, char** argv) {
  const int iters = argc > 2 ? atoi(argv[2]) : 32768;
  if (iters < 8) {
    fprintf(stderr, "iters must be >= 8\n");
    return 2;
  }
  const ProbeDevice dev = probe_device();
  if (dev.sms <= 0 || dev.cycles == nullptr) {
    fprintf(stderr, "no CUDA device\n");
    return 2;
  }
  std::vector<Result> out;
  bool ok = sweep<Op::kE4m3>(out, dev, iters);
  ok &= sweep<Op::kBf16>(out, dev, iters);
  const Result* e4m3 = best(out, "e4m3_m16n8k32");
  const Result* bf16 = best(out, "bf16_m16n8k16");
  if (!ok || e4m3 == nullptr || bf16 == nullptr) {
    fprintf(stderr, "a configuration failed: no peak reported\n");
    return 1;
  }
  printf("peak e4m3 m16n8k32: %.1f TFLOP/s (%.1f FLOP/clk/SM, warps %d chains %d); bf16 m16n8k16: %.1f TFLOP/s\n",
         e4m3->tflops, e4m3->flop_per_clk_sm, e4m3->warps, e4m3->chains, bf16->tflops);
  if (argc > 1) {
    char extra[64];
    snprintf(extra, sizeof extra, "\"iters\": %d, ", iters);
    FILE* f = open_probe_json(argv[1], dev.sms, extra);
    if (f == nullptr) {
      fprintf(stderr, "cannot write %s\n", argv[1]);
      return 1;
    }
    for (size_t i = 0; i < out.size(); ++i)
      fprintf(f, "  {\"op\": \"%s\", \"warps\": %d, \"chains\": %d, \"flop_per_clk_sm\": %.1f, \"tflops\": %.2f, "
                 "\"clock_ghz\": %.3f}%s\n",
              out[i].op.c_str(), out[i].warps, out[i].chains, out[i].flop_per_clk_sm, out[i].tflops,
              out[i].clock_ghz, i + 1 < out.size() ? "," : "");
    fprintf(f, "], \"peak\": {\n");
    write_peak(f, "e4m3_m16n8k32", e4m3, true);
    write_peak(f, "bf16_m16n8k16", bf16, false);
    fprintf(f, "}}\n");
    fclose(f);
  }
  return 0;
}
