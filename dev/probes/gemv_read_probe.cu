// Read-pattern probe for the decode GEMV (an H200 diagnostic; not part of the extension).
//
// Question: is the tensor-core GEMV's weight access pattern what holds it at ~70% of the copy rate
// at M = 1 (gemv/NOTES.md)? Each kernel here reads an fp8 weight [n, k] exactly once with the
// GEMV's grid, block and occupancy but no math: it folds the loaded words into one value and
// stores it only if it equals a value random data never gives, so no load can be elided. The
// time of a pattern is therefore the time of its loads alone, side by side with a plain stream.
//
// Patterns (`--` names in the output):
//   stream        grid-stride 16-byte loads, 512 contiguous bytes per warp instruction (ceiling)
//   t8            the GEMV's: block = one 16-row column tile, KS warps split K into 64-byte
//                 windows (warp w takes w, w + KS, ...), lane (g, t) loads 16 bytes of rows g and
//                 g + 8, U windows per trip; occupancy capped to the real kernel's blocks per SM
//   t8_free       the same with no occupancy cap (what more resident warps alone would give)
//   t8_adjacent   a warp's U windows adjacent (128 contiguous bytes of a row per warp per trip)
//   t8_l2_256     t8 with the .L2::256B prefetch hint on every load
//   t8_persistent t8 with one wave of (SMs x the real blocks per SM) blocks looping over column
//                 tiles and no shared-memory cap: the real occupancy with the whole L1 (the caps
//                 above take shared memory, which shrinks L1)
//   lines         same tiles and warps, each warp instruction reads 4 rows x 128 contiguous bytes
//                 (whole lines; the layout of the gemv_mma_t8_lines candidate row)
//   row           same tiles and warps, but each warp instruction reads 512 contiguous bytes of
//                 one row (the layout a row-per-warp kernel would need)
//
// Build and run (the H200 stage `gemv_probe` of dev/device/h200_check.sh does this):
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a dev/probes/gemv_read_probe.cu -o probe
//   ./probe out.json
#include <cuda_runtime.h>

#include "../../vllm_blockfp8/csrc/gemv/gemv.h"
#include "probe_util.cuh"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

constexpr uint32_t kNever = 0x9e3779b9u;  // folded value that random weights do not produce

enum class Hint { kNoAllocate, kNoAllocateL2Prefetch };

template <Hint H>
__device__ __forceinline__ uint4 load16(const uint8_t* p) {
  uint4 v;
  if constexpr (H == Hint::kNoAllocate) {
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
  } else {
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
  }
  return v;
}

template <typename I>
__host__ __device__ __forceinline__ I imin(I a, I b) { return a < b ? a : b; }

__device__ __forceinline__ uint32_t fold(uint32_t acc, const uint4& v) {
  return acc ^ (v.x + v.y) ^ (v.z * 3u + v.w);
}

__device__ __forceinline__ void keep(uint32_t acc, uint32_t* sink) {
  if (acc == kNever) sink[blockIdx.x & 1023] = acc;
}

__global__ void stream_kernel(const uint8_t* b, int64_t vectors, uint32_t* sink) {
  constexpr int U = 4;
  uint32_t acc = 0;
  const int64_t step = int64_t(gridDim.x) * blockDim.x * U;
  for (int64_t base = int64_t(blockIdx.x) * blockDim.x * U + threadIdx.x; base < vectors;
       base += step) {
    uint4 v[U];
#pragma unroll
    for (int j = 0; j < U; ++j) {
      const int64_t i = imin<int64_t>(base + j * blockDim.x, vectors - 1);
      v[j] = load16<Hint::kNoAllocate>(b + i * 16);
    }
#pragma unroll
    for (int j = 0; j < U; ++j) acc = fold(acc, v[j]);
  }
  keep(acc, sink);
}

// The GEMV's column-tile walk. Adjacent: a warp's U windows are consecutive instead of KS apart.
template <int KS, int U, bool Adjacent, Hint H>
__global__ void tile_kernel(const uint8_t* b, int n, int k, int tiles, uint32_t* sink) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int windows = k / 64;
  uint32_t acc = 0;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int row0 = imin(tile * 16 + g, n - 1), row1 = imin(tile * 16 + g + 8, n - 1);
    const uint8_t* p0 = b + int64_t(row0) * k + t * 16;
    const uint8_t* p1 = b + int64_t(row1) * k + t * 16;
    for (int base = Adjacent ? warp * U : warp; base < windows; base += KS * U) {
      uint4 v0[U], v1[U];
#pragma unroll
      for (int j = 0; j < U; ++j) {
        const int w = imin(base + (Adjacent ? j : j * KS), windows - 1);
        v0[j] = load16<H>(p0 + int64_t(w) * 64);
        v1[j] = load16<H>(p1 + int64_t(w) * 64);
      }
#pragma unroll
      for (int j = 0; j < U; ++j) acc = fold(fold(acc, v0[j]), v1[j]);
    }
  }
  keep(acc, sink);
}

// Same tiles and warps; warp w reads rows w, w + KS, ... of the tile, 512 contiguous bytes per
// warp instruction, U instructions in flight.
template <int KS, int U>
__global__ void row_kernel(const uint8_t* b, int n, int k, int tiles, uint32_t* sink) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int chunks = k / 512;  // the probe's shapes have k % 512 == 0
  uint32_t acc = 0;
  for (int r = warp; r < 16; r += KS) {
    const int row = imin(int(blockIdx.x) * 16 + r, n - 1);
    const uint8_t* p = b + int64_t(row) * k + lane * 16;
    for (int c = 0; c < chunks; c += U) {
      uint4 v[U];
#pragma unroll
      for (int j = 0; j < U; ++j)
        v[j] = load16<Hint::kNoAllocate>(p + int64_t(imin(c + j, chunks - 1)) * 512);
#pragma unroll
      for (int j = 0; j < U; ++j) acc = fold(acc, v[j]);
    }
  }
  keep(acc, sink);
}

// Warp w takes 128-byte line chunks w, w + KS, ... of the tile's 16 rows; load i of a lane covers
// row lane / 8 + 4 i, bytes 16 (lane % 8) of the chunk.
template <int KS>
__global__ void lines_kernel(const uint8_t* b, int n, int k, int tiles, uint32_t* sink) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint32_t acc = 0;
  for (int chunk = warp; chunk < k / 128; chunk += KS) {
    uint4 v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = imin(int(blockIdx.x) * 16 + lane / 8 + 4 * i, n - 1);
      v[i] = load16<Hint::kNoAllocate>(b + int64_t(row) * k + chunk * 128 + 16 * (lane % 8));
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) acc = fold(acc, v[i]);
  }
  keep(acc, sink);
}

struct Shape {
  const char* name;
  int n, k;
};

// The real t8 launch per shape, from the extension's own rules (gemv.h: ksplit, pins_residency),
// and the blocks per SM it gets: at 62 registers 4 blocks of 8 warps or 2 of 16; the pinned entry
// point's 40-register cap fits 3.
struct Launch {
  int ks, blocks_per_sm;
};

Launch real_launch(int n, int sms) {
  const int ks = blockfp8::gemv::ksplit(n);
  if (ks == 8) return {8, 4};
  return {ks, blockfp8::gemv::pins_residency((n + 15) / 16, sms, ks, 1) ? 3 : 2};
}

// Dynamic shared memory that leaves room for exactly `blocks` blocks per SM.
size_t smem_for(int blocks) {
  int per_sm = 0;
  CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, 0));
  return blocks <= 0 ? 0 : size_t(per_sm) / blocks - 2048;
}

template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

template <int KS>
void run_shape(const Shape& s, int sms, const uint8_t* pool, int64_t pool_bytes, uint32_t* sink,
               FILE* json, bool& first) {
  const int64_t bytes = int64_t(s.n) * s.k;
  const int copies = int(std::min<int64_t>(pool_bytes / bytes, std::max<int64_t>(4, (256ll << 20) / bytes + 1)));
  const int tiles = (s.n + 15) / 16;
  const Launch real = real_launch(s.n, sms);
  if (real.ks != KS) {
    std::fprintf(stderr, "%s: the real kernel splits K %d ways, not %d\n", s.name, real.ks, KS);
    std::exit(1);
  }
  const int threads = 32 * KS;
  auto at = [&](int c) { return pool + int64_t(c) * bytes; };

  struct Row {
    std::string pattern;
    GraphTiming t;
  };
  std::vector<Row> rows;
  {
    const int64_t vectors = bytes / 16;
    const int blocks = int(std::min<int64_t>((vectors + 1023) / 1024, int64_t(sms) * 64));
    rows.push_back({"stream", time_graph([&](int c, cudaStream_t st) {
                      stream_kernel<<<blocks, 256, 0, st>>>(at(c), vectors, sink);
                    }, copies)});
  }
  auto tile_case = [&](const char* name, auto kernel, int grid, int blocks_per_sm) {
    const size_t smem = smem_for(blocks_per_sm);
    allow_smem(kernel, smem);
    rows.push_back({name, time_graph([&](int c, cudaStream_t st) {
                      kernel<<<grid, threads, smem, st>>>(at(c), s.n, s.k, tiles, sink);
                    }, copies)});
  };
  tile_case("t8", tile_kernel<KS, 2, false, Hint::kNoAllocate>, tiles, real.blocks_per_sm);
  tile_case("t8_free", tile_kernel<KS, 2, false, Hint::kNoAllocate>, tiles, 0);
  tile_case("t8_adjacent", tile_kernel<KS, 2, true, Hint::kNoAllocate>, tiles, real.blocks_per_sm);
  tile_case("t8_l2_256", tile_kernel<KS, 2, false, Hint::kNoAllocateL2Prefetch>, tiles, real.blocks_per_sm);
  tile_case("t8_persistent", tile_kernel<KS, 2, false, Hint::kNoAllocate>,
            std::min(tiles, sms * real.blocks_per_sm), 0);
  tile_case("lines", lines_kernel<KS>, tiles, real.blocks_per_sm);
  tile_case("row", row_kernel<KS, 2>, tiles, real.blocks_per_sm);
  tile_case("row_u4", row_kernel<KS, 4>, tiles, real.blocks_per_sm);

  const double stream_us = rows[0].t.us;
  std::printf("\n%s (%d x %d, %.1f MB, KS %d, %d blocks/SM in the real kernel, %d copies)\n", s.name,
              s.n, s.k, bytes / 1e6, KS, real.blocks_per_sm, copies);
  std::printf("  %-14s %9s %8s %9s\n", "pattern", "us", "TB/s", "/stream");
  for (const Row& r : rows) {
    const double tbs = bytes / (r.t.us * 1e-6) / 1e12;
    std::printf("  %-14s %9.2f %8.2f %9.2f\n", r.pattern.c_str(), r.t.us, tbs, r.t.us / stream_us);
    std::fprintf(json,
                 "%s\n  {\"shape\": \"%s\", \"n\": %d, \"k\": %d, \"ksplit\": %d, \"blocks_per_sm\": %d, "
                 "\"pattern\": \"%s\", \"us\": %.3f, \"tb_per_s\": %.4f, \"over_stream\": %.4f}",
                 first ? "" : ",", s.name, s.n, s.k, KS, real.blocks_per_sm, r.pattern.c_str(), r.t.us,
                 tbs, r.t.us / stream_us);
    first = false;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const char* json_path = argc > 1 ? argv[1] : "gemv_read_probe.json";
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  const int64_t pool_bytes = 640ll << 20;
  uint8_t* pool = nullptr;
  uint32_t* sink = nullptr;
  CHECK(cudaMalloc(&pool, pool_bytes));
  CHECK(cudaMalloc(&sink, 4096));
  {
    // Random bytes (an LCG per word): never zeros, so the fold cannot be constant-folded away.
    std::vector<uint32_t> host(1 << 20);
    uint32_t state = 12345u;
    for (auto& w : host) w = (state = state * 1664525u + 1013904223u);
    for (int64_t off = 0; off < pool_bytes; off += int64_t(host.size()) * 4)
      CHECK(cudaMemcpy(pool + off, host.data(), std::min<int64_t>(host.size() * 4, pool_bytes - off),
                       cudaMemcpyHostToDevice));
  }
  FILE* json = std::fopen(json_path, "w");
  std::fprintf(json, "{\"gpu\": \"%s\", \"sms\": %d, \"records\": [", prop.name, sms);
  bool first = true;
  // Shapes from benchmarks (shapes.py): the worst M = 1 ratios and the largest weights.
  const Shape ks16[] = {{"dsv3.2112x7168", 2112, 7168},
                        {"qwen3-8b.qkv", 6144, 4096},
                        {"seed.5120x17408", 5120, 17408},
                        {"dsv3.7168x2048", 7168, 2048},
                        {"dsv3.7168x16384", 7168, 16384}};
  const Shape ks8[] = {{"qwen3-8b.gate_up", 24576, 4096},
                       {"seed.8192x2048", 8192, 2048}};
  for (const Shape& s : ks16) run_shape<16>(s, sms, pool, pool_bytes, sink, json, first);
  for (const Shape& s : ks8) run_shape<8>(s, sms, pool, pool_bytes, sink, json, first);
  std::fprintf(json, "\n]}\n");
  std::fclose(json);
  CHECK(cudaFree(pool));
  CHECK(cudaFree(sink));
  return 0;
}
