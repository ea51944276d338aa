// Host-side data of the NVFP4 GEMV probe (fp4_frag_gemv_probe.cu): NVFP4 codes and scales decoded to float, the fp32
// reference kernel every variant is checked against, the fragment packing it times (exp8 scales,
// vllm_blockfp8/csrc/fp4/fragment.cuh: the host twin of reference.fragment_nvfp4_weight, built from the paired words;
// the paired copy is still uploaded, unused since the probe stopped timing it), random inputs, and the copy rate the
// floor uses.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "probe_util.cuh"

namespace probe {

using bf16 = __nv_bfloat16;

// ---- reference and packing --------------------------------------------------------------------------------------

__host__ __device__ inline float e2m1_value(int code) {
  const float mag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  return (code & 8) ? -mag[code & 7] : mag[code & 7];
}

__host__ __device__ inline float e4m3_value(uint8_t b) {
  const int e = (b >> 3) & 15, mant = b & 7;
  const float v = e == 0 ? ldexpf(float(mant) / 8.f, -6) : ldexpf(1.f + float(mant) / 8.f, e - 7);
  return (b & 0x80) ? -v : v;
}

// out[m, n] in fp32 and sum |terms| (the error bound's scale), from the logical codes [n, k] and scales [n, k / 16].
__global__ void reference_kernel(const bf16* x, const uint8_t* codes, const uint8_t* scales, float* out, float* abs_sum,
                                 int m, int n, int k) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(m) * n) return;
  const int row = int(i % n), tok = int(i / n);
  float s = 0.f, a = 0.f;
  for (int kk = 0; kk < k; ++kk) {
    const float v = __bfloat162float(x[int64_t(tok) * k + kk]) * e2m1_value(codes[int64_t(row) * k + kk]) *
                    e4m3_value(scales[int64_t(row) * (k / 16) + kk / 16]);
    s += v;
    a += fabsf(v);
  }
  out[i] = s;
  abs_sum[i] = a;
}

// reference.NVFP4_PAIRED_BITS: element e's (mantissa, exponent low, exponent high, sign) bit positions in a word.
constexpr int kPairedBits[8][4] = {{0, 1, 2, 9},     {16, 17, 18, 25}, {4, 5, 6, 13},   {20, 21, 22, 29},
                                   {10, 11, 12, 19}, {26, 27, 28, 3},  {14, 7, 8, 15},  {30, 23, 24, 31}};

inline uint32_t paired_word(const int (&codes)[8]) {
  uint32_t w = 0;
  for (int e = 0; e < 8; ++e)
    for (int b = 0; b < 4; ++b) w |= uint32_t((codes[e] >> b) & 1) << kPairedBits[e][b];
  return w;
}

// frag: the fragment codes, every zero-scale group's codes zeroed (exp8 has no zero); frag_x8: its exp8 scales.
struct Packed {
  std::vector<uint8_t> paired, frag, frag_x8;
};

// bf16 bits of scale * 2^119 (exact: an e4m3 value has 4 significant bits and 448 * 2^119 < bf16's max).
inline uint16_t scale_bits(uint8_t b) {
  const float v = std::ldexp(e4m3_value(b), 119);
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return uint16_t(u >> 16);
}

// The exp8 byte of a positive e4m3 scale (vllm_blockfp8/csrc/fp4/fragment.cuh); 0 for a zero scale (its group's codes
// are zeroed).
inline uint8_t exp8_byte(uint8_t b) {
  if ((b & 0x7f) == 0) return 0;
  if ((b & 0x80) != 0) {
    std::fprintf(stderr, "exp8: negative scale 0x%02x\n", b);
    std::exit(1);
  }
  const uint16_t h = scale_bits(b);
  return uint8_t(((((h >> 7) & 0xff) - 237) << 3) | ((h >> 4) & 7));
}

inline Packed pack(const std::vector<uint8_t>& codes, const std::vector<uint8_t>& scales, int n, int k) {
  Packed p;
  p.paired.resize(size_t(n) * k / 2);
  for (int r = 0; r < n; ++r)
    for (int j = 0; j < k / 8; ++j) {
      int c[8];
      for (int e = 0; e < 8; ++e) c[e] = codes[size_t(r) * k + 8 * j + e];
      const uint32_t w = paired_word(c);
      std::memcpy(&p.paired[size_t(r) * k / 2 + 4 * j], &w, 4);
    }
  const int stages = k / 64, tiles = n / 16;
  p.frag.resize(size_t(n) * k / 2);
  p.frag_x8.resize(size_t(n) * k / 16);
  for (int tile = 0; tile < tiles; ++tile)
    for (int s = 0; s < stages; ++s) {
      const size_t block = size_t(tile) * stages + s;
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, t = lane % 4, r0 = 16 * tile + g, r1 = r0 + 8;
        for (int kk = 0; kk < 4; ++kk) {
          const int k0 = 64 * s + 16 * kk + 2 * t;
          auto code = [&](int r, int kc) {
            return (scales[size_t(r) * (k / 16) + kc / 16] & 0x7f) == 0 ? 0 : int(codes[size_t(r) * k + kc]);
          };
          const int c[8] = {code(r0, k0), code(r0, k0 + 1), code(r1, k0),     code(r1, k0 + 1),
                            code(r0, k0 + 8), code(r0, k0 + 9), code(r1, k0 + 8), code(r1, k0 + 9)};
          const uint32_t w = paired_word(c);
          std::memcpy(&p.frag[block * 512 + 16 * lane + 4 * kk], &w, 4);
        }
      }
      for (int g = 0; g < 8; ++g)
        for (int half = 0; half < 2; ++half)
          for (int kk = 0; kk < 4; ++kk)
            p.frag_x8[block * 64 + 8 * g + 4 * half + kk] =
                exp8_byte(scales[size_t(16 * tile + g + 8 * half) * (k / 16) + 4 * s + kk]);
    }
  return p;
}

template <typename T>
T* upload(const std::vector<T>& h) {
  T* d = nullptr;
  CHECK(cudaMalloc(&d, h.size() * sizeof(T)));
  CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

inline std::vector<uint8_t> random_scales(std::mt19937& rng, size_t count) {
  // Mostly in [2^-4, 1.875] (as the first-use checks), with zeros and subnormals: every path of the conversion.
  std::vector<uint8_t> s(count);
  for (auto& b : s) {
    const uint32_t r = rng();
    b = (r % 64 == 0) ? 0 : (r % 64 == 1) ? uint8_t(1 + (r >> 8) % 7) : uint8_t(0x18 + (r >> 8) % 40);
  }
  return s;
}

// Bytes per second of a device-to-device copy (read + write counted), the floor's rate.
inline double copy_rate(cudaStream_t st) {
  const size_t bytes = size_t(1) << 30;
  void *a, *b;
  CHECK(cudaMalloc(&a, bytes));
  CHECK(cudaMalloc(&b, bytes));
  CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, st));
  const float ms = elapsed_ms(st, [&] {
    for (int i = 0; i < 5; ++i) CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, st));
  });
  CHECK(cudaFree(a));
  CHECK(cudaFree(b));
  return 2.0 * 5 * double(bytes) / (ms * 1e-3);
}

// ---- operands, checking and timing ----------------------------------------------------------------------------

struct Operands {  // one weight copy in both packings, on the device
  uint8_t *paired, *scales, *frag, *frag_x8;
};

inline Operands upload_operands(const Packed& p, const std::vector<uint8_t>& scales) {
  return {upload(p.paired), upload(scales), upload(p.frag), upload(p.frag_x8)};
}

// A timing copy: random bytes (every code is valid in every packing) and scales from the checks' range.
inline Operands random_operands(std::mt19937& rng, int n, int k) {
  const size_t wbytes = size_t(n) * k / 2, sbytes = size_t(n) * k / 16;
  std::vector<uint8_t> w(wbytes), s8 = random_scales(rng, sbytes), x8(sbytes);
  for (auto& b : w) b = uint8_t(rng());
  for (size_t i = 0; i < sbytes; ++i) x8[i] = exp8_byte(s8[i]);
  return {upload(w), upload(s8), upload(w), upload(x8)};
}

inline void free_operands(const Operands& o) {
  for (void* ptr : {(void*)o.paired, (void*)o.scales, (void*)o.frag, (void*)o.frag_x8}) CHECK(cudaFree(ptr));
}

// launch(operands, x, global_scale, out, stream) on random codes, scales (zeros and subnormals among them) and x
// [m, k], against reference_kernel: the largest |out - ref| / (2^-8 |ref| + 2^-16 sum |terms|), i.e. bf16 output
// rounding plus fp32 accumulation order; a wrong code or scale among K moves a sum by ~sum |terms| / K, far above
// the second term. <= 1 passes; an output never written (NaN-poisoned) fails.
template <class Launch>
double check_launch(int m, int n, int k, std::mt19937& rng, Launch&& launch) {
  std::vector<uint8_t> codes(size_t(n) * k);
  for (auto& c : codes) c = uint8_t(rng() & 15);
  const std::vector<uint8_t> scales = random_scales(rng, size_t(n) * k / 16);
  std::vector<bf16> xh(size_t(m) * k);
  std::normal_distribution<float> normal;
  for (auto& v : xh) v = __float2bfloat16(normal(rng));
  const Operands o = upload_operands(pack(codes, scales, n, k), scales);
  bf16* x = upload(xh);
  float* gs = upload(std::vector<float>(n, 1.f));
  uint8_t* dcodes = upload(codes);
  float *ref, *abs_sum;
  bf16* out;
  CHECK(cudaMalloc(&ref, size_t(m) * n * 4));
  CHECK(cudaMalloc(&abs_sum, size_t(m) * n * 4));
  CHECK(cudaMalloc(&out, size_t(m) * n * 2));
  CHECK(cudaMemset(out, 0xff, size_t(m) * n * 2));
  reference_kernel<<<unsigned((int64_t(m) * n + 255) / 256), 256>>>(x, dcodes, o.scales, ref, abs_sum, m, n, k);
  launch(o, x, gs, out, cudaStream_t(0));
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  std::vector<float> r(size_t(m) * n), a(size_t(m) * n);
  std::vector<bf16> got(size_t(m) * n);
  CHECK(cudaMemcpy(r.data(), ref, r.size() * 4, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(a.data(), abs_sum, a.size() * 4, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(got.data(), out, got.size() * 2, cudaMemcpyDeviceToHost));
  double worst = 0.0;
  for (size_t i = 0; i < r.size(); ++i) {
    const double err = std::fabs(double(__bfloat162float(got[i])) - r[i]);
    const double ratio = err / (std::ldexp(std::fabs(r[i]), -8) + std::ldexp(a[i], -16) + 1e-30);
    worst = std::isnan(ratio) ? INFINITY : std::max(worst, ratio);
  }
  free_operands(o);
  for (void* ptr : {(void*)x, (void*)gs, (void*)dcodes, (void*)ref, (void*)abs_sum, (void*)out}) CHECK(cudaFree(ptr));
  return worst;
}

// Microseconds per launch (probe_util.cuh's time_graph: the median replay of one launch per weight copy).
template <class Launch>
double time_launch(const std::vector<Operands>& copies, Launch&& launch) {
  return time_graph([&](int c, cudaStream_t st) { launch(copies[c], st); }, int(copies.size())).us;
}

// The timing copies of one shape: enough weight copies that together they exceed L2 (160 MB), at least 2.
inline std::vector<Operands> timing_copies(std::mt19937& rng, int n, int k) {
  const size_t bytes = size_t(n) * k / 2 + size_t(n) * k / 16;
  std::vector<Operands> copies(std::max<size_t>(2, (size_t(160) << 20) / bytes + 1));
  for (auto& o : copies) o = random_operands(rng, n, k);
  return copies;
}

// One timed point: x [m, k] = 0.5, global scales 1, the output, and the floor: packed weight + e4m3 scales + x + out
// over the measured copy rate.
struct Point {
  bf16* x = nullptr;
  float* gs = nullptr;
  bf16* out = nullptr;
  double floor_us = 0.0;
  Point(int m, int n, int k, double copy_rate) {
    x = upload(std::vector<bf16>(size_t(m) * k, __float2bfloat16(0.5f)));
    gs = upload(std::vector<float>(n, 1.f));
    CHECK(cudaMalloc(&out, size_t(m) * n * 2));
    const size_t bytes = size_t(n) * k / 2 + size_t(n) * k / 16 + size_t(m) * k * 2 + size_t(m) * n * 2;
    floor_us = 1e6 * double(bytes) / copy_rate;
  }
  Point(const Point&) = delete;
  Point& operator=(const Point&) = delete;
  ~Point() {
    CHECK(cudaFree(x));
    CHECK(cudaFree(gs));
    CHECK(cudaFree(out));
  }
};

// The JSON file's opening: the probe, the GPU, the git state (BLOCKFP8_GIT_STATE), the copy rate, the checks.
inline FILE* open_json(const char* path, const char* probe_name, double copy_rate, bool checks_passed) {
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  FILE* f = std::fopen(path, "w");
  if (f == nullptr) {
    std::fprintf(stderr, "cannot write %s\n", path);
    std::exit(1);
  }
  const char* git = std::getenv("BLOCKFP8_GIT_STATE");
  std::fprintf(f, "{\"probe\": \"%s\", \"gpu\": \"%s\", \"git\": \"%s\", \"sms\": %d, \"copy_bytes_per_s\": %.4g, "
               "\"checks_passed\": %s, \"results\": [\n",
               probe_name, prop.name, git ? git : "unknown", prop.multiProcessorCount, copy_rate,
               checks_passed ? "true" : "false");
  return f;
}

// One timed variant of a point: printed (us, x the floor) and written as "<name>_us".
inline void record(FILE* f, const char* name, double us, double floor_us) {
  std::printf("  %s %.1f (%.2fx)", name, us, us / floor_us);
  std::fprintf(f, ", \"%s_us\": %.3f", name, us);
}

inline int close_json(FILE* f, bool checks_passed) {
  std::fprintf(f, "\n]}\n");
  std::fclose(f);
  return checks_passed ? 0 : 1;
}

}  // namespace probe
