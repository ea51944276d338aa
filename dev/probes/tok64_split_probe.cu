// Data path against loop in the 64-token-tile SM90 GEMM kernel (rows sm90_tok64_fitn and sm90_tok64_fitn_narrow;
// an H200 diagnostic, not part of the extension; gemm/NOTES.md, "The tok64 kernel").
//
// Question: where does a K block's time go on the same tiles as DeepGEMM's (64 tokens x 32..192 weight rows)?
// Variants, bits of the kernel's kProbe: the data path alone (producer, TMA, barriers: no math), the loop alone
// (no loads), the row without the resident weight-scale copy and its wait, without the epilogue's stores, with
// the old direct 4-byte stores, with the straddle boundary at run time at every width, and the skeleton
// (launch, barriers, nothing else); per-CTA timelines (%globaltimer and clock64 at six points of a CTA's life)
// say where the fixed cost per call goes. Findings so far: at 32 wide the data path binds, at 64 the loop, at
// 96-192 the two are within a few per cent of each other; the old stores were most of the fixed cost at
// 144-192 wide.
//
// It compiles the row's own kernel file with diagnostic bits (sm90_tok64_fitn.cu, namespace probe) and times each
// variant at M = 128 on N = 2048 / 3072 / 4096 / 5120 / 6144 / 9216 / 10240 / 11008 (the rule's widths 32 / 48 / 64 /
// 80 / 96 / 144 / 160 / 192) at K = 2048..8192: CUDA graphs of one launch per weight copy (copies past 256 MiB, so
// the weights come from DRAM as in the benchmarks), median of 15 replays, then per K block = the slope of a
// least-squares fit of time against K blocks and fixed = its intercept. Then the per-CTA timeline (probe::kTimeline)
// at K = 2048 and 8192, a table of medians and maxima, and with a second argument every CTA's values in a file.
// `probe --one VARIANT N K` launches one variant three times, untimed, for ncu.
//
// Build and run (the H200 stage `tok64_probe` of dev/device/h200_check.sh does this; it compiles off-device as well,
// ~4 min on 2 cores, and the binary can be carried):
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
//        -I <nvidia-cutlass include> -I vllm_blockfp8/csrc dev/probes/tok64_split_probe.cu -o probe \
//     && ./probe out.json [timeline.txt]
#include "gemm/sm90_tok64_fitn.cu"

#include <climits>
#include <cstdio>
#include <iterator>
#include <string>
#include <vector>

#include "probe_util.cuh"

namespace tok64 = blockfp8::gemm::sm90::tok64;

namespace {

constexpr int kM = 128;
constexpr int kKs[] = {2048, 4096, 6144, 8192};
constexpr size_t kWeightBytesPerRun = size_t(256) << 20;  // past the 50 MiB L2 several times over
constexpr int kReplays = 15;

// Random e4m3 bytes without NaN (exponent and mantissa below all ones) and positive scales near 1.
__global__ void fill_bytes(uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    p[i] = uint8_t((h & 0x80) | (h % 0x70));
  }
}
__global__ void fill_scales(float* p, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = 0.5f + float(i % 7) / 8;
}

template <int kProbe>
cudaError_t launch_probe(const blockfp8::gemm::Problem& p, cudaStream_t stream) {
  switch (tok64::tile_n(p)) {
    case 32: return tok64::launch_width<32, __nv_bfloat16, kProbe>(p, stream);
    case 48: return tok64::launch_width<48, __nv_bfloat16, kProbe>(p, stream);
    case 64: return tok64::launch_width<64, __nv_bfloat16, kProbe>(p, stream);
    case 80: return tok64::launch_width<80, __nv_bfloat16, kProbe>(p, stream);
    case 96: return tok64::launch_width<96, __nv_bfloat16, kProbe>(p, stream);
    case 144: return tok64::launch_width<144, __nv_bfloat16, kProbe>(p, stream);
    case 160: return tok64::launch_width<160, __nv_bfloat16, kProbe>(p, stream);
    case 192: return tok64::launch_width<192, __nv_bfloat16, kProbe>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

// The same launch with programmatic dependent launch (the benchmarks' default launch mode at K <= 4096): in the
// graph each launch may start while the previous one drains.
template <int kProbe>
cudaError_t launch_probe_pdl(const blockfp8::gemm::Problem& p, cudaStream_t stream) {
  blockfp8::gemm::Problem q = p;
  q.pdl = true;
  return launch_probe<kProbe>(q, stream);
}

struct Variant {
  const char* name;
  cudaError_t (*launch)(const blockfp8::gemm::Problem&, cudaStream_t);
};

namespace pb = tok64::probe;
constexpr int kNoLoads = pb::kNoLoads, kDirect = pb::kDirectStores;
const Variant kVariants[] = {
    {"row", launch_probe<0>},
    {"row, direct stores", launch_probe<kDirect>},
    {"row, no stores", launch_probe<pb::kNoStores>},
    {"row, no w-scales", launch_probe<pb::kNoWeightScales>},
    {"no loads", launch_probe<kNoLoads>},
    {"no loads, direct stores", launch_probe<kNoLoads | kDirect>},
    {"row, PDL", launch_probe_pdl<0>},
    {"row, direct stores, PDL", launch_probe_pdl<kDirect>},
    {"skeleton", launch_probe<kNoLoads | pb::kNoMath | pb::kNoWeightScales | pb::kNoStores>},
};
constexpr int kNs[] = {2048, 3072, 4096, 5120, 6144, 9216, 10240, 11008};
// Per CTA, where the time goes (probe::kTimeline): the row with the quad stores and with the direct ones.
const Variant kTimelineVariants[] = {
    {"row", launch_probe<pb::kTimeline>},
    {"row, direct stores", launch_probe<pb::kTimeline | kDirect>},
};
constexpr int kTimelineKs[] = {2048, 8192};

struct Point {
  int n, k;
  double us;
};

// Microseconds per launch at (n, k): a graph of one launch per weight copy, median over replays. direct: three
// plain launches on one weight copy instead, untimed (for ncu: `probe --one VARIANT N K`).
// timeline: the probe::kTimeline buffer (16 values a CTA), read back after the replays (the last launch's).
double time_point(const Variant& v, int n, int k, int sms, bool direct = false,
                  std::vector<long long>* timeline = nullptr) {
  const int copies = direct ? 1 : int(std::max<size_t>(2, kWeightBytesPerRun / (size_t(n) * k)));
  const int k_blocks = k / 128, n_blocks = (n + 127) / 128;
  uint8_t *a, *b;
  float *a_scale, *b_scale;
  void* d;
  cudaMalloc(&a, size_t(kM) * k);
  cudaMalloc(&b, size_t(copies) * n * k);
  cudaMalloc(&a_scale, sizeof(float) * kM * k_blocks);
  cudaMalloc(&b_scale, sizeof(float) * size_t(copies) * n_blocks * k_blocks);
  cudaMalloc(&d, size_t(kM) * n * 2);
  fill_bytes<<<1024, 256>>>(a, size_t(kM) * k, 1);
  fill_bytes<<<4096, 256>>>(b, size_t(copies) * n * k, 2);
  fill_scales<<<64, 256>>>(a_scale, size_t(kM) * k_blocks);
  fill_scales<<<256, 256>>>(b_scale, size_t(copies) * n_blocks * k_blocks);
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  blockfp8::gemm::Problem p;
  p.a = a, p.a_scale = a_scale, p.a_scale_ld = kM, p.m = kM, p.n = n, p.k = k, p.d = d, p.sm_count = sms;
  cudaError_t err = cudaSuccess;
  if (direct) {
    p.b = b, p.b_scale = b_scale;
    for (int r = 0; r < 3 && err == cudaSuccess; ++r) err = v.launch(p, stream);
    if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
    printf("%s n=%d k=%d: %s\n", v.name, n, k, cudaGetErrorString(err));
    exit(err == cudaSuccess ? 0 : 1);
  }
  cudaGraph_t graph;
  cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal);
  for (int c = 0; c < copies && err == cudaSuccess; ++c) {
    p.b = b + size_t(c) * n * k;
    p.b_scale = b_scale + size_t(c) * n_blocks * k_blocks;
    err = v.launch(p, stream);
  }
  cudaStreamEndCapture(stream, &graph);
  cudaGraphExec_t exec = nullptr;
  if (err == cudaSuccess) err = cudaGraphInstantiate(&exec, graph, 0);
  std::vector<float> ms;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  for (int r = 0; r < kReplays + 2 && err == cudaSuccess; ++r) {
    cudaEventRecord(e0, stream);
    cudaGraphLaunch(exec, stream);
    cudaEventRecord(e1, stream);
    err = cudaEventSynchronize(e1);
    float t = 0;
    cudaEventElapsedTime(&t, e0, e1);
    if (r >= 2) ms.push_back(t);  // two warm-up replays
  }
  if (err != cudaSuccess) {
    printf("%s n=%d k=%d: %s\n", v.name, n, k, cudaGetErrorString(err));
    exit(1);
  }
  std::sort(ms.begin(), ms.end());
  if (timeline) {
    long long* device_timeline = nullptr;
    cudaMemcpyFromSymbol(&device_timeline, tok64::timeline, sizeof(device_timeline));
    cudaMemcpy(timeline->data(), device_timeline, timeline->size() * sizeof(long long), cudaMemcpyDeviceToHost);
  }
  if (exec) cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  cudaStreamDestroy(stream);
  cudaFree(a), cudaFree(b), cudaFree(a_scale), cudaFree(b_scale), cudaFree(d);
  return 1000.0 * ms[ms.size() / 2] / copies;
}

// Least squares us = fixed + per_block * blocks.
void fit(const std::vector<Point>& pts, double* fixed, double* per_block) {
  double mx = 0, my = 0;
  for (const Point& q : pts) mx += q.k / 128.0, my += q.us;
  mx /= pts.size(), my /= pts.size();
  double sxy = 0, sxx = 0;
  for (const Point& q : pts) sxy += (q.k / 128.0 - mx) * (q.us - my), sxx += (q.k / 128.0 - mx) * (q.k / 128.0 - mx);
  *per_block = sxy / sxx;
  *fixed = my - *per_block * mx;
}

}  // namespace

int main(int argc, char** argv) {
  const ProbeDevice dev = probe_device();
  if (argc == 5 && std::string(argv[1]) == "--one") {
    const int i = atoi(argv[2]);
    if (i < 0 || i >= int(std::size(kVariants))) return 2;
    time_point(kVariants[i], atoi(argv[3]), atoi(argv[4]), dev.sms, true);
  }
  FILE* f = argc > 1 ? open_probe_json(argv[1], dev.sms, "\"m\": 128, ") : nullptr;
  printf("%-26s %6s %6s %10s %10s   us at K = 2048 / 4096 / 6144 / 8192\n", "variant", "n", "tile_n", "per block",
         "fixed");
  bool first = true;
  // Variants inner, so that a width's variants run close together in time (drift between them stays small).
  for (int n : kNs) {
    for (const Variant& v : kVariants) {
      std::vector<Point> pts;
      for (int k : kKs) pts.push_back({n, k, time_point(v, n, k, dev.sms)});
      double fixed, per_block;
      fit(pts, &fixed, &per_block);
      blockfp8::gemm::Problem shape;
      shape.m = kM, shape.n = n, shape.k = kKs[0], shape.sm_count = dev.sms;
      const int width = tok64::tile_n(shape);
      printf("%-26s %6d %6d %10.4f %10.3f   %.2f / %.2f / %.2f / %.2f\n", v.name, n, width, per_block, fixed,
             pts[0].us, pts[1].us, pts[2].us, pts[3].us);
      if (f) {
        fprintf(f, "%s  {\"variant\": \"%s\", \"n\": %d, \"tile_n\": %d, \"per_block_us\": %.5f, \"fixed_us\": %.4f, "
                   "\"us\": [%.4f, %.4f, %.4f, %.4f]}",
                first ? "" : ",\n", v.name, n, width, per_block, fixed, pts[0].us, pts[1].us, pts[2].us, pts[3].us);
        first = false;
      }
    }
  }
  if (f) fprintf(f, "\n]}\n"), fclose(f);

  // The timeline: each interval's median and largest value over the CTAs (ns, %globaltimer), from kernel entry;
  // "entry spread" is the last CTA's entry after the first's, "end" the last CTA's epilogue end after the first
  // entry, beside the launch's time in the graph (us).
  long long* device_timeline = nullptr;
  const int max_ctas = 4096;
  cudaMalloc(&device_timeline, sizeof(long long) * 16 * max_ctas);
  cudaMemcpyToSymbol(tok64::timeline, &device_timeline, sizeof(device_timeline));
  FILE* tf = argc > 2 ? fopen(argv[2], "w") : nullptr;
  printf("\n%-20s %6s %6s %5s %9s  %-44s %-44s %8s %8s\n", "timeline variant", "n", "k", "CTAs", "graph us",
         "median ns: dep.wait / w-scales / stage 0 / loop / epi", "largest ns: same", "entry sp", "end");
  for (int n : kNs) {
    for (int k : kTimelineKs) {
      for (const Variant& v : kTimelineVariants) {
        blockfp8::gemm::Problem shape;
        shape.m = kM, shape.n = n, shape.k = k, shape.sm_count = dev.sms;
        const int ctas = int(tok64::tile_count(shape, tok64::tile_n(shape)));
        std::vector<long long> t(16 * size_t(ctas));
        const double us = time_point(v, n, k, dev.sms, false, &t);
        long long first_entry = LLONG_MAX, last_entry = 0, last_end = 0;
        std::vector<std::vector<long long>> span(5);
        for (int c = 0; c < ctas; ++c) {
          const long long* e = &t[16 * size_t(c)];
          first_entry = std::min(first_entry, e[0]), last_entry = std::max(last_entry, e[0]);
          last_end = std::max(last_end, e[5]);
          for (int i = 0; i < 5; ++i) span[i].push_back(e[i + 1] - e[i]);
        }
        char med[128], top[128];
        int a = 0, b = 0;
        for (int i = 0; i < 5; ++i) {
          std::sort(span[i].begin(), span[i].end());
          a += snprintf(med + a, sizeof(med) - a, "%s%lld", i ? " / " : "", span[i][ctas / 2]);
          b += snprintf(top + b, sizeof(top) - b, "%s%lld", i ? " / " : "", span[i].back());
        }
        printf("%-20s %6d %6d %5d %9.2f  %-44s %-44s %8lld %8lld\n", v.name, n, k, ctas, us, med, top,
               last_entry - first_entry, last_end - first_entry);
        if (tf) {
          fprintf(tf, "# %s n=%d k=%d ctas=%d graph_us=%.3f (per CTA: 6 globaltimer ns, 6 clock64)\n", v.name, n, k,
                  ctas, us);
          for (int c = 0; c < ctas; ++c) {
            for (int i = 0; i < 6; ++i) fprintf(tf, "%lld ", t[16 * size_t(c) + i] - first_entry);
            for (int i = 8; i < 14; ++i) fprintf(tf, "%lld%c", t[16 * size_t(c) + i], i == 13 ? '\n' : ' ');
          }
        }
      }
    }
  }
  if (tf) fclose(tf);
  return 0;
}
