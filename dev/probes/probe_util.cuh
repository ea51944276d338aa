// Helpers shared by the probes: CHECK, event timing and a CUDA-graph timer over weight copies (every probe); for the clock64 probes
// (dev/probes/wgmma_rate_probe.cu, tma_ingress_probe.cu) each kernel writes its CTA's cycle count to
// cycles[blockIdx.x], the slowest CTA is the time, and keep_live keeps the measured work from being compiled away.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(call)                                                                    \
  do {                                                                                 \
    cudaError_t err_ = (call);                                                         \
    if (err_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(err_)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

// Milliseconds between two events around what `enqueue()` puts on `stream`.
template <typename Enqueue>
float elapsed_ms(cudaStream_t stream, Enqueue&& enqueue) {
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  CHECK(cudaEventRecord(start, stream));
  enqueue();
  CHECK(cudaEventRecord(stop, stream));
  CHECK(cudaEventSynchronize(stop));
  float ms = 0.f;
  CHECK(cudaEventElapsedTime(&ms, start, stop));
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  return ms;
}

struct GraphTiming {
  double us;
  int copies;
};

// Median per-launch time of `launch(copy)` over a CUDA graph that walks `copies` copies of the
// weight (together larger than L2, so L2 never serves a copy twice in a row).
// An instantiated CUDA graph of launch(0, stream), ..., launch(copies - 1, stream) in stream order.
template <typename Launcher>
cudaGraphExec_t capture_chain(Launcher& launch, int copies, cudaStream_t stream) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (int c = 0; c < copies; ++c) launch(c, stream);
  CHECK(cudaStreamEndCapture(stream, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CHECK(cudaGraphDestroy(graph));
  return exec;
}

template <typename Launcher>
GraphTiming time_graph(Launcher launch, int copies) {
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraphExec_t exec = capture_chain(launch, copies, stream);
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) CHECK(cudaGraphLaunch(exec, stream));
  std::vector<double> samples;
  for (int i = 0; i < 25; ++i) {
    CHECK(cudaEventRecord(start, stream));
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    samples.push_back(1e3 * ms / copies);
  }
  CHECK(cudaGetLastError());
  std::sort(samples.begin(), samples.end());
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  CHECK(cudaStreamDestroy(stream));
  return {samples[samples.size() / 2], copies};
}

// After the timed region: sums the register fragments (any indexable tensor with a size()) and stores the
// sum only if it is a value the probes' data never gives, so the wgmma and promotions feeding them stay live
// (ptxas drops wgmma whose results nothing reads).
template <class... Frags>
__device__ __forceinline__ void keep_live(float* sink, const Frags&... frags) {
  float s = 0.f;
  (
      [&] {
#pragma unroll
        for (int i = 0; i < int(size(frags)); ++i) s += frags(i);
      }(),
      ...);
  if (s == -1.2345f) sink[0] = s;
}

// What the one-CTA-per-SM probes allocate: the SM count, one cycle count per CTA, and keep_live's sink.
struct ProbeDevice {
  int sms = 0;
  long long* cycles = nullptr;
  float* sink = nullptr;
};
inline ProbeDevice probe_device() {
  ProbeDevice d;
  cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, 0);
  cudaMalloc(&d.cycles, d.sms * sizeof(long long));
  cudaMalloc(&d.sink, sizeof(float));
  return d;
}

// The largest per-CTA cycle count of the last launch (one CTA per SM).
inline long long worst_cta_cycles(const long long* device_cycles, int ctas) {
  std::vector<long long> host(ctas);
  cudaMemcpy(host.data(), device_cycles, ctas * sizeof(long long), cudaMemcpyDeviceToHost);
  long long worst = 0;
  for (long long c : host) worst = c > worst ? c : worst;
  return worst;
}

// Opens `path` and writes the result header up to the opening of the "results" array: GPU, CUDA
// runtime, git state (BLOCKFP8_GIT_STATE: the device's copy of the tree has no .git, see
// dev/device/h200_check.sh), SM count, plus `extra` ("\"key\": value, " pairs) from the probe.
inline FILE* open_probe_json(const char* path, int sms, const char* extra) {
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  int runtime = 0;
  cudaRuntimeGetVersion(&runtime);
  const char* git = getenv("BLOCKFP8_GIT_STATE");
  FILE* f = fopen(path, "w");
  fprintf(f, "{\"gpu\": \"%s\", \"cuda_runtime\": %d, \"git\": \"%s\", \"sms\": %d, %s\"results\": [\n", prop.name,
          runtime, git ? git : "unknown", sms, extra);
  return f;
}
