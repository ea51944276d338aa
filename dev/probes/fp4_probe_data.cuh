// Host-side data of dev/probes/fp4_fragment_probe.cu: NVFP4 codes and scales decoded to float, the fp32 reference
// kernel the probe checks every variant against, the packings it times (today's paired bytes, the A-fragment order
// with e4m3 or bf16 scales), random inputs, and the copy rate the floor uses.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

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

struct Packed {
  std::vector<uint8_t> paired, frag, frag_s8, frag_s16;
};

// bf16 bits of scale * 2^119 (exact: an e4m3 value has 4 significant bits and 448 * 2^119 < bf16's max).
inline uint16_t scale_bits(uint8_t b) {
  const float v = std::ldexp(e4m3_value(b), 119);
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return uint16_t(u >> 16);
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
  p.frag_s8.resize(size_t(n) * k / 16);
  p.frag_s16.resize(size_t(n) * k / 8);
  for (int tile = 0; tile < tiles; ++tile)
    for (int s = 0; s < stages; ++s) {
      const size_t block = size_t(tile) * stages + s;
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, t = lane % 4, r0 = 16 * tile + g, r1 = r0 + 8;
        for (int kk = 0; kk < 4; ++kk) {
          const int k0 = 64 * s + 16 * kk + 2 * t;
          auto code = [&](int r, int kc) { return int(codes[size_t(r) * k + kc]); };
          const int c[8] = {code(r0, k0), code(r0, k0 + 1), code(r1, k0),     code(r1, k0 + 1),
                            code(r0, k0 + 8), code(r0, k0 + 9), code(r1, k0 + 8), code(r1, k0 + 9)};
          const uint32_t w = paired_word(c);
          std::memcpy(&p.frag[block * 512 + 16 * lane + 4 * kk], &w, 4);
        }
      }
      for (int g = 0; g < 8; ++g)
        for (int half = 0; half < 2; ++half)
          for (int kk = 0; kk < 4; ++kk) {
            const uint8_t b = scales[size_t(16 * tile + g + 8 * half) * (k / 16) + 4 * s + kk];
            p.frag_s8[block * 64 + 8 * g + 4 * half + kk] = b;
            const uint16_t h = scale_bits(b);
            std::memcpy(&p.frag_s16[block * 128 + 16 * g + 8 * half + 2 * kk], &h, 2);
          }
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

}  // namespace probe
