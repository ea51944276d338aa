// Linear path tables, one per arch, as data: first row with max_m >= M whose path can serve the
// shape wins. The GEMV/GEMM crossover is where quantizing the activations and running the
// tensor-core W8A8 GEMM beats re-reading the weight per token group in the GEMV (see the Hopper
// table's comment for what is measured). Unsupported: K % 16 != 0 (no path; ops.py rejects it).
#include "linear.h"

namespace blockfp8::linear {
namespace {

struct LinearRow {
  TileRow info;
  Path path;
};

// Hopper: the CUTLASS W8A8 GEMM exists. Crossover (H200, bench_gemv/bench_gemm 2026-11-29): the
// GEMV at M = 16 (qkv 12.4 us) still beats quant + W8A8 at M = 32 (~16.5 us); M = 17..31 is
// not measured yet, so the bound stays at the largest measured GEMV tile.
constexpr LinearRow kSm90[] = {
    {{"gemv", 16, "weight-only decode, H200: 1.57x floor at M=1 vs 2.16x for the best W8A8 peer"}, Path::kGemv},
    {{"w8a8_gemm", kUnboundedM, "1x128 activation quant + CUTLASS wgmma block-scaled GEMM"}, Path::kW8A8},
    {{"dequant_matmul", kUnboundedM, "fallback for shapes no W8A8 row takes (N % 8, K % 128)"},
     Path::kDequantMatmul},
};

// Ada: the SM89 mma.sync W8A8 GEMM (gemm/sm89/) where it is built; the GEMV bound is the SM90 one until the SM89
// rows' crossover is measured (as forced rows on the H200).
constexpr LinearRow kSm89[] = {
    {{"gemv", 16, "weight-only decode: no activation quant pass, the weight is read once"}, Path::kGemv},
    {{"w8a8_gemm", kUnboundedM, "1x128 activation quant + mma.sync e4m3 block-scaled GEMM (gemm/sm89)"},
     Path::kW8A8},
    {{"dequant_matmul", kUnboundedM, "only where no W8A8 row applies (K % 128): dequantize + cuBLAS"},
     Path::kDequantMatmul},
};

// Blackwell GeForce: CUTLASS's SM120 blockwise-scaled GEMM (gemm/sm120/) where it is built.
constexpr LinearRow kSm120[] = {
    {{"gemv", 16, "weight-only decode: no activation quant pass, the weight is read once"}, Path::kGemv},
    {{"w8a8_gemm", kUnboundedM, "1x128 activation quant + CUTLASS SM120 blockwise GEMM (gemm/sm120)"},
     Path::kW8A8},
    {{"dequant_matmul", kUnboundedM, "only where no W8A8 row applies (K % 128): dequantize + cuBLAS"},
     Path::kDequantMatmul},
};

// Any other GPU: no W8A8 kernel exists for it, so mid and large M dequantize the weight once per call and run
// cuBLAS in 16-bit.
constexpr LinearRow kGeneric[] = {
    {{"gemv", 16, "weight-only decode: no activation quant pass, the weight is read once"}, Path::kGemv},
    {{"dequant_matmul", kUnboundedM, "no W8A8 kernel for this arch: dequantize + cuBLAS"},
     Path::kDequantMatmul},
};

struct Table {
  const LinearRow* rows;
  int count;
};

template <int N>
constexpr Table of(const LinearRow (&rows)[N]) { return {rows, N}; }

Table table(int cc) {
  if (cc == 90) return of(kSm90);
  if (cc == 89) return of(kSm89);
  if (cc == 120) return of(kSm120);
  return of(kGeneric);
}

}  // namespace

gemv::Problem gemv_shape(const Shape& s) {
  gemv::Problem p{};
  p.m = s.m, p.n = s.n, p.k = s.k, p.x_stride = s.k, p.out_stride = s.n, p.bf16 = true, p.sm_count = s.sm_count;
  return p;
}

gemm::Problem gemm_shape(const Shape& s) {
  gemm::Problem p{};
  p.m = s.m, p.n = s.n, p.k = s.k, p.a_scale_ld = (s.m + 3) / 4 * 4, p.out_bf16 = true, p.sm_count = s.sm_count;
  p.arch = s.cc;
  return p;
}

int table_arch(int device_cc) {
  const int gemm_arch = gemm::table_arch(device_cc);
  return gemm_arch != 0 ? gemm_arch : device_cc;
}

int num_rows(int cc) { return table(cc).count; }
const TileRow& row(int cc, int i) { return table(cc).rows[i].info; }
Path path(int cc, int i) { return table(cc).rows[i].path; }

const char* rejects(int cc, int i, const Shape& s) {
  switch (path(cc, i)) {
    case Path::kGemv:
      return gemv::select(gemv_shape(s)) >= 0 ? nullptr : "no GEMV row takes this shape";
    case Path::kW8A8:
      // table_arch() hands the linear op the device's own table under "none", so the switch is checked here.
      if (gemm::off()) return "BLOCKFP8_GEMM_TABLE=none: the W8A8 GEMM is off";
      if (!gemm::built(s.cc)) return "this build has no W8A8 GEMM for this arch";
      if (s.k % 128 != 0) return "W8A8 needs K % 128 == 0 (1x128 activation groups)";
      // Every GEMM row takes what the GEMM accepts; which one runs is planned once, by the GEMM op itself.
      return gemm::rejects(gemm_shape(s)) == nullptr ? nullptr : "no W8A8 GEMM row takes this shape";
    case Path::kDequantMatmul:
      return s.k % 16 == 0 ? nullptr : "dequantize needs K % 16 == 0";
  }
  return "unknown path";
}

int select(const Shape& s) {
  const Table t = table(s.cc);
  for (int i = 0; i < t.count; ++i)
    if (s.m <= t.rows[i].info.max_m && rejects(s.cc, i, s) == nullptr) return i;
  return -1;
}

}  // namespace blockfp8::linear
