// Where a wave of the SM90 NVFP4 wgmma GEMM spends its time (an H100/H200 diagnostic; the kernel is the extension's,
// vllm_blockfp8/csrc/fp4/sm90/w4a16_wgmma.cuh, compiled here with its phase marks defined).
//
// Question (fp4/NOTES.md): one unsplit wave of the 128x256 tile costs ~0.78 us a 64-deep stage plus ~11 us that is
// not the loop (13.0 us at K = 128, 60.9 at K = 4096 on 16896 rows, M = 256). Which phase holds the 11 us: the gap
// between kernels, CTAs starting late, the first stage's x copies, its weight loads, the loop, the epilogue, or the
// slowest CTA? Answer (an H100, benchmarks/results/fp4_wgmma_phase_probe.json): the epilogue, 7-9 us with 2-byte stores
// from the accumulators ("direct": measured at f37ccff, whose kernel still had that path), 3.2-3.9 us staged through
// shared memory (the kernel's only unsplit epilogue since).
//
//   out[m, n] = global_scale[n] * sum_k x[m, k] * e2m1(code[n, k]) * scale[n, k / 16]      (bf16 x and out)
//
// Method. The kernel's marks: thread 0 records %globaltimer at its start (mark 0, with %smid), when stage 0's x has
// landed for every thread (1: the first barrier), when stage 0's four wgmma are issued (2: its weights had to land
// and be decoded), when the loop's last wgmma retired (3), and each warp's lane 0 records its exit (4: the latest).
// The launches run in a CUDA graph over weight copies that together exceed L2 (probe_util.cuh: the median of 25
// replays is the time per launch), then one more replay is recorded. Per configuration it prints the medians over
// every CTA of the recorded replay's launches of each phase, the spread of CTA starts within a launch, the span of a
// launch (first start to last exit), the gap from a launch's last exit to the next launch's first start, and the
// graph's time per launch. An empty kernel with the same grid, block and shared memory gives the floor of launching
// and retiring such a grid. The weight bytes are random (valid exp8 scales): timing does not depend on them; one
// output is checked finite. Written as JSON, one record per configuration.
//
// Build and run (the stage `fp4_wgmma_phase_probe` of dev/device/h200_check.sh does this):
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
//        dev/probes/fp4_wgmma_phase_probe.cu -o probe && ./probe out.json
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "probe_util.cuh"

namespace phase_probe {

constexpr int kMarks = 6;  // 0 start, 1 stage 0's x landed, 2 stage 0 issued, 3 loop retired, 4 last warp out, 5 SM
__device__ unsigned long long* g_marks;  // [launch % g_capacity][cta][kMarks]
__device__ unsigned g_capacity;           // launches the buffer holds
__device__ unsigned g_launch;             // launches that have finished
__device__ unsigned g_warps_out;          // warps of the running launch that have left

__device__ __forceinline__ unsigned long long now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned ctas() { return gridDim.x * gridDim.y * gridDim.z; }
__device__ __forceinline__ unsigned long long* cta_marks() {
  const unsigned cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned launch = *reinterpret_cast<volatile unsigned*>(&g_launch) % g_capacity;
  return g_marks + (size_t(launch) * ctas() + cta) * kMarks;
}
__device__ __forceinline__ void mark(int i) {
  if (threadIdx.x != 0) return;
  unsigned long long* m = cta_marks();
  m[i] = now();
  if (i == 0) {
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    m[5] = smid;
  }
}
// A launch's last warp out advances the launch count; the next launch starts only after this one has retired.
__device__ __forceinline__ void leave() {
  if ((threadIdx.x & 31) != 0) return;
  atomicMax(cta_marks() + 4, now());
  __threadfence();
  if (atomicAdd(&g_warps_out, 1u) == ctas() * (blockDim.x / 32) - 1) {
    g_warps_out = 0;
    __threadfence();
    atomicAdd(&g_launch, 1u);
  }
}

}  // namespace phase_probe

#define BLOCKFP8_WGMMA_PHASE(i, when) \
  if (when) phase_probe::mark(i)
#define BLOCKFP8_WGMMA_PHASE_END() phase_probe::leave()
// Another revision of the kernel with the same parameters (its marks added by hand) times the same way:
// -DPHASE_PROBE_HEADER='"path"'.
#ifdef PHASE_PROBE_HEADER
#include PHASE_PROBE_HEADER
#else
#include "../../vllm_blockfp8/csrc/fp4/sm90/w4a16_wgmma.cuh"
#endif

namespace phase_probe {

using bf16 = __nv_bfloat16;
using namespace blockfp8::fp4;

// The same grid, block and shared memory as a GEMM launch, doing nothing but the marks.
__global__ void __launch_bounds__(sm90::kThreads) empty_kernel() {
  mark(0);
  leave();
}

struct Config {
  const char* what;
  int tok, m, n, k;
  bool empty;
};

struct Phases {
  double graph_us, start_spread_us, span_us, gap_us, x_us, first_stage_us, loop_us, epilogue_us, end_spread_us;
  int launches, ctas;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <int TOK>
Phases run(const Config& c) {
  const int n_tiles = (c.n + sm90::kRows - 1) / sm90::kRows, t_tiles = (c.m + TOK - 1) / TOK;
  const dim3 grid(t_tiles, n_tiles, 1);
  const int ctas = t_tiles * n_tiles;
  const size_t code_bytes = size_t(c.n) * c.k / 2, scale_bytes = size_t(c.n) * c.k / 16;
  const int copies = int(std::clamp<size_t>(160000000 / (code_bytes + scale_bytes) + 1, 4, 96));

  std::mt19937 rng(1234);
  std::vector<uint8_t> codes(code_bytes), scales(scale_bytes);
  for (auto& b : codes) b = uint8_t(rng());
  for (auto& b : scales) b = uint8_t(rng() % 128);  // exp8 bytes 0..127: scales 2^-7 .. 2^8 (fragment.cuh)
  std::vector<bf16> x(size_t(c.m) * c.k);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto& v : x) v = __float2bfloat16(u(rng));

  uint8_t *d_codes, *d_scales;
  bf16 *d_x, *d_out;
  float* d_gs;
  CHECK(cudaMalloc(&d_codes, code_bytes * copies));
  CHECK(cudaMalloc(&d_scales, scale_bytes * copies));
  CHECK(cudaMalloc(&d_x, x.size() * sizeof(bf16)));
  CHECK(cudaMalloc(&d_out, size_t(c.m) * c.n * sizeof(bf16)));
  CHECK(cudaMalloc(&d_gs, sizeof(float)));
  for (int i = 0; i < copies; ++i) {
    CHECK(cudaMemcpy(d_codes + code_bytes * i, codes.data(), code_bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_scales + scale_bytes * i, scales.data(), scale_bytes, cudaMemcpyHostToDevice));
  }
  CHECK(cudaMemcpy(d_x, x.data(), x.size() * sizeof(bf16), cudaMemcpyHostToDevice));
  const float one = 1.f;
  CHECK(cudaMemcpy(d_gs, &one, sizeof(float), cudaMemcpyHostToDevice));

  unsigned long long* d_marks;
  const size_t mark_words = size_t(copies) * ctas * kMarks;
  CHECK(cudaMalloc(&d_marks, mark_words * 8));
  CHECK(cudaMemset(d_marks, 0, mark_words * 8));
  const unsigned capacity = unsigned(copies), zero = 0;
  CHECK(cudaMemcpyToSymbol(g_marks, &d_marks, sizeof(d_marks)));
  CHECK(cudaMemcpyToSymbol(g_capacity, &capacity, sizeof(capacity)));
  CHECK(cudaMemcpyToSymbol(g_warps_out, &zero, sizeof(zero)));

  const int smem = sm90::WgmmaTile<TOK>::kSmemBytes;
  auto* gemm = &sm90::w4a16_wgmma_kernel<TOK, bf16>;
  CHECK(cudaFuncSetAttribute(gemm, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CHECK(cudaFuncSetAttribute(&empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  auto launch = [&](int copy, cudaStream_t s) {
    if (c.empty) {
      empty_kernel<<<grid, sm90::kThreads, smem, s>>>();
      return;
    }
    const Args<bf16> a{d_x, d_codes + code_bytes * copy, d_scales + scale_bytes * copy, d_gs, 0, nullptr, d_out,
                       c.m, c.n, c.k, c.k, c.n};
    gemm<<<grid, sm90::kThreads, smem, s>>>(a, nullptr);
  };

  if (!c.empty) {  // one output row checked finite and not all zero
    launch(0, nullptr);
    CHECK(cudaDeviceSynchronize());
    std::vector<bf16> out(c.n);
    CHECK(cudaMemcpy(out.data(), d_out, c.n * sizeof(bf16), cudaMemcpyDeviceToHost));
    bool finite = true, nonzero = false;
    for (bf16 v : out) finite &= std::isfinite(__bfloat162float(v)), nonzero |= __bfloat162float(v) != 0.f;
    if (!finite || !nonzero) {
      std::fprintf(stderr, "%s: output not finite or all zero\n", c.what);
      std::exit(1);
    }
  }

  Phases r{};
  r.graph_us = time_graph(launch, copies).us;
  // One more replay, recorded from launch 0 (time_graph replays the same captured chain).
  CHECK(cudaMemcpyToSymbol(g_launch, &zero, sizeof(zero)));
  CHECK(cudaMemset(d_marks, 0, mark_words * 8));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraphExec_t exec = capture_chain(launch, copies, stream);
  CHECK(cudaGraphLaunch(exec, stream));
  CHECK(cudaStreamSynchronize(stream));
  CHECK(cudaGetLastError());
  std::vector<unsigned long long> marks(mark_words);
  CHECK(cudaMemcpy(marks.data(), d_marks, mark_words * 8, cudaMemcpyDeviceToHost));

  std::vector<double> start_spread, span, gap, dx, dfirst, dloop, depi, end_spread;
  unsigned long long prev_end = 0;
  for (int l = 0; l < copies; ++l) {
    const unsigned long long* m = marks.data() + size_t(l) * ctas * kMarks;
    unsigned long long first = ~0ull, last_start = 0, last_end = 0;
    std::vector<double> ends;
    for (int i = 0; i < ctas; ++i) {
      const unsigned long long* q = m + size_t(i) * kMarks;
      first = std::min(first, q[0]), last_start = std::max(last_start, q[0]), last_end = std::max(last_end, q[4]);
      ends.push_back(double(q[4]));
      if (!c.empty) {
        dx.push_back(1e-3 * double(q[1] - q[0]));
        dfirst.push_back(1e-3 * double(q[2] - q[1]));
        dloop.push_back(1e-3 * double(q[3] - q[2]));
        depi.push_back(1e-3 * double(q[4] - q[3]));
      }
    }
    start_spread.push_back(1e-3 * double(last_start - first));
    span.push_back(1e-3 * double(last_end - first));
    end_spread.push_back(1e-3 * (double(last_end) - median(ends)));
    if (l > 0) gap.push_back(1e-3 * (double(first) - double(prev_end)));
    prev_end = last_end;
  }
  r.start_spread_us = median(start_spread), r.span_us = median(span), r.gap_us = median(gap);
  r.x_us = median(dx), r.first_stage_us = median(dfirst), r.loop_us = median(dloop), r.epilogue_us = median(depi);
  r.end_spread_us = median(end_spread);
  r.launches = copies, r.ctas = ctas;

  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaStreamDestroy(stream));
  for (void* p : {(void*)d_codes, (void*)d_scales, (void*)d_x, (void*)d_out, (void*)d_gs, (void*)d_marks})
    CHECK(cudaFree(p));
  return r;
}

}  // namespace phase_probe

int main(int argc, char** argv) {
  using namespace phase_probe;
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int one_wave = sms * 128;  // N with one 128-row tile per SM
  const Config configs[] = {
      {"empty, tok 256 grid", 256, 256, one_wave, 128, true},
      {"128x256, K 128", 256, 256, one_wave, 128, false},
      {"128x256, K 512", 256, 256, one_wave, 512, false},
      {"128x256, K 1024", 256, 256, one_wave, 1024, false},
      {"128x256, K 4096", 256, 256, one_wave, 4096, false},
      {"128x256, 2 waves", 256, 256, 2 * one_wave, 1024, false},
      {"empty, tok 128 grid", 128, 256, one_wave, 128, true},
      {"128x128, K 1024", 128, 256, one_wave, 1024, false},
      {"128x128, K 4096", 128, 256, one_wave, 4096, false},
  };

  FILE* f = argc > 1 ? open_probe_json(argv[1], sms, "") : nullptr;
  std::printf("%-26s %5s %6s %6s %8s %7s %7s %7s %7s %7s %7s %8s %7s\n", "config", "N", "K", "CTAs", "graph_us",
              "gap", "starts", "x", "stage0", "loop", "epi", "span", "tail");
  bool first_record = true;
  for (const Config& c : configs) {
    const Phases r = c.tok == 256 ? run<256>(c) : run<128>(c);
    std::printf("%-26s %5d %6d %6d %8.2f %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f %8.2f %7.2f\n", c.what, c.n, c.k,
                r.ctas, r.graph_us, r.gap_us, r.start_spread_us, r.x_us, r.first_stage_us, r.loop_us, r.epilogue_us,
                r.span_us, r.end_spread_us);
    if (f)
      std::fprintf(f,
                   "%s{\"what\": \"%s\", \"epilogue\": \"%s\", \"tok\": %d, \"m\": %d, \"n\": %d, \"k\": %d, "
                   "\"ctas\": %d, \"launches\": %d, \"graph_us\": %.3f, \"gap_us\": %.3f, \"start_spread_us\": %.3f, "
                   "\"x_us\": %.3f, \"first_stage_us\": %.3f, \"loop_us\": %.3f, \"epilogue_us\": %.3f, "
                   "\"span_us\": %.3f, \"tail_us\": %.3f}",
                   first_record ? "" : ",\n", c.what, c.empty ? "none" : "staged", c.tok, c.m,
                   c.n, c.k, r.ctas, r.launches, r.graph_us, r.gap_us, r.start_spread_us, r.x_us, r.first_stage_us,
                   r.loop_us, r.epilogue_us, r.span_us, r.end_spread_us);
    first_record = false;
  }
  if (f) std::fprintf(f, "\n]}\n"), std::fclose(f);
  std::printf("gap: a launch's first CTA start after the previous launch's last exit; starts: spread of CTA starts; "
              "x / stage0 / loop / epi: medians over CTAs (thread 0); span: first start to last exit; tail: last exit "
              "after the median exit (us)\n");
  return 0;
}
