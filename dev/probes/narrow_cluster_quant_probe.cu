// The activation quantizer fused into a 64-token SM90 GEMM with each x value converted ONCE: a cluster of C CTAs
// along N shares one token tile (an H100/H200 diagnostic; not part of the extension).
//
// Question (gemm/NOTES.md, open leads): narrow_fused_quant_probe.cu converted every x block once per N tile in one
// warpgroup's registers and took 6-11x the two launches (quantizer + tok64). Converting once per value is ~8 us a
// SM on kv_a at M = 4096 where per-N-tile conversion is >= 46 us. Does a cluster that splits the conversion by rows
// and shares the e4m3 tile through distributed shared memory reach the two launches' time, or bf16's?
//
//   out[m, n] = sum_kb (q[m, kb] . w[n, kb]) * sx[m, kb] * w_scale[n / 128, kb]      (the quantizer's bits, as v1)
//
// Layout: grid (C, M / 64), cluster (C, 1, 1): CTA rank r computes out[m0 .. m0 + 64, r * TileN ..] (N = C x TileN).
// Per K block (128) CTA r TMA-loads bf16 x rows m0 + r R .. + R (R = 64 / C; two 128-byte-swizzled 64-column boxes)
// and its TileN x 128 fp8 weight tile. Its math warpgroup converts those R rows (R values a thread; amax over the
// row's 128 / R lanes by shfl.xor; the branch-free exact quotient, exact_quotient_branchless) and stores the e4m3
// bytes and the R token scales into every CTA of the cluster (st.shared::cluster at the wgmma's K-major 128-byte
// swizzled address), then arrives on each CTA's A barrier (release.cluster, after fence.proxy.async). A CTA's
// wgmma waits for all C shares (acquire.cluster), runs 4 shared-operand e4m3 wgmma into a fresh fragment and
// promotes as tok64 (acc += partial * (token scale * weight scale), per 8-column group the weight scale block below
// or above 128): the bits should equal the two launches'. Block k + 1 is converted while block k's wgmma run; a
// stage's A tile is rewritten only after every CTA of the cluster has released it (a cluster-wide empty barrier).
// Unsupported here: M % 64 != 0, N != C x TileN, K % 128 != 0, no K split (so small M leaves SMs idle).
// Status: written and compile-checked on sm_90a, not yet run.
//
// Build and run (the stage `narrow_cluster_quant_probe` of dev/device/h200_check.sh does this):
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -I <nvidia-cutlass include> \
//        -I <cublas include> -I vllm_blockfp8/csrc dev/probes/narrow_cluster_quant_probe.cu -lcublas -o /tmp/p
//   /tmp/p [out.json]
#define NARROW_FUSED_NO_MAIN
#include "narrow_fused_quant_probe.cu"

namespace cluster_probe {

using namespace cute;
using fused_probe::bf16;
using fused_probe::Fp8;
using fused_probe::Params;
using fused_probe::tok64::Barrier;
constexpr int kTok = 64, kTileK = 128, kThreads = 160;

template <int TileN, int C>
struct ClusterTile {
  static constexpr int kRows = kTok / C;             // x rows a CTA converts, and values a thread converts
  static constexpr int kLanesPerRow = 128 / kRows;   // lanes sharing a row's amax
  static constexpr int kXBytes = kRows * kTileK * 2;  // the bf16 share: two boxes of kRows x 64
  static constexpr int kABytes = kTok * kTileK;       // the whole e4m3 A tile
  static constexpr int kBBytes = TileN * kTileK;
  static constexpr int kStageBytes = kABytes + kBBytes + kXBytes + kTok * 4;
  static constexpr int kStages = std::min(8, (227 * 1024 - 2048) / kStageBytes);
  static constexpr int kSmem = 1024 + kStages * kStageBytes + 6 * 8 * kStages;
  static_assert(kTok % C == 0 && kRows % 8 == 0 && kLanesPerRow <= 32, "8, 16 or 32 rows a CTA");
  static_assert(kXBytes / 2 % 1024 == 0, "each swizzled x box starts on a 1024-byte atom");
  static_assert(kStages >= 3, "too few stages");
  using Mma = decltype(make_tiled_mma(SM90::GMMA::ss_op_selector<Fp8, Fp8, float, Shape<_64, Int<TileN>, _32>>()));
};

__device__ __forceinline__ uint32_t cluster_address(uint32_t local, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
}
__device__ __forceinline__ void remote_arrive(uint32_t local_barrier, uint32_t rank) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];"
               :
               : "r"(cluster_address(local_barrier, rank))
               : "memory");
}
// A wait that acquires what other CTAs of the cluster released into this barrier.
__device__ __forceinline__ void wait_cluster(uint64_t* barrier, uint32_t phase) {
  const uint32_t at = cute::cast_smem_ptr_to_uint(barrier);
  uint32_t done = 0;
  while (!done)
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(at), "r"(phase)
        : "memory");
}
__device__ __forceinline__ void cluster_barrier() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}

template <int TileN, int C>
__global__ void __launch_bounds__(kThreads, 1)
    cluster_gemm(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap w_map, const Params p) {
  using T = ClusterTile<TileN, C>;
  constexpr int S = T::kStages, R = T::kRows;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (cute::cast_smem_ptr_to_uint(smem_raw) & 1023)) & 1023);
  uint8_t* smem_a = smem;                       // S x 64 x 128 e4m3, written by the cluster's converters
  uint8_t* smem_w = smem_a + S * T::kABytes;    // S x TileN x 128 fp8 (TMA)
  uint8_t* smem_x = smem_w + S * T::kBBytes;    // S x this CTA's R bf16 rows (TMA)
  float* smem_sx = reinterpret_cast<float*>(smem_x + S * T::kXBytes);  // S x 64 token scales
  uint64_t* x_full = reinterpret_cast<uint64_t*>(smem_sx + S * kTok);
  uint64_t* x_empty = x_full + S;
  uint64_t* w_full = x_empty + S;
  uint64_t* w_empty = w_full + S;
  uint64_t* a_full = w_empty + S;   // C x 4 warps' shares of block k landed
  uint64_t* a_empty = a_full + S;   // C x 4 warps released the stage's A tile
  const uint32_t rank = blockIdx.x;  // the cluster is the grid's x extent
  const int n0 = int(rank) * TileN, m0 = int(blockIdx.y) * kTok;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      Barrier::init(&x_full[s], 1), Barrier::init(&x_empty[s], 4), Barrier::init(&w_full[s], 1);
      Barrier::init(&w_empty[s], 4), Barrier::init(&a_full[s], 4 * C), Barrier::init(&a_empty[s], 4 * C);
    }
    cutlass::arch::fence_barrier_init();
  }
  cluster_barrier();  // every CTA's barriers exist before any remote arrive

  if (warp == 4) {
    if (lane == 0)
      for (int kb = 0, s = 0, phase = 0; kb < p.k_blocks; ++kb) {
        if (kb >= S) Barrier::wait(&x_empty[s], phase ^ 1);
        Barrier::arrive_and_expect_tx(&x_full[s], T::kXBytes);
        const uint32_t xs = cute::cast_smem_ptr_to_uint(smem_x + s * T::kXBytes);
        fused_probe::tok64::tma_load_2d(xs, &x_map, kb * kTileK, m0 + int(rank) * R, &x_full[s]);
        fused_probe::tok64::tma_load_2d(xs + T::kXBytes / 2, &x_map, kb * kTileK + 64, m0 + int(rank) * R, &x_full[s]);
        if (kb >= S) Barrier::wait(&w_empty[s], phase ^ 1);
        Barrier::arrive_and_expect_tx(&w_full[s], T::kBBytes);
        fused_probe::tok64::tma_load_2d(cute::cast_smem_ptr_to_uint(smem_w + s * T::kBBytes), &w_map, kb * kTileK, n0,
                                        &w_full[s]);
        if (++s == S) s = 0, phase ^= 1;
      }
  } else {
    auto a_layout = tile_to_shape(GMMA::Layout_K_SW128_Atom<Fp8>{}, Shape<_64, Int<kTileK>, Int<S>>{});
    auto w_layout = tile_to_shape(GMMA::Layout_K_SW128_Atom<Fp8>{}, Shape<Int<TileN>, Int<kTileK>, Int<S>>{});
    Tensor sA = make_tensor(make_smem_ptr(reinterpret_cast<Fp8*>(smem_a)), a_layout);
    Tensor sW = make_tensor(make_smem_ptr(reinterpret_cast<Fp8*>(smem_w)), w_layout);
    typename T::Mma mma;
    auto thr = mma.get_thread_slice(threadIdx.x);
    Tensor tCrA = thr.make_fragment_A(thr.partition_A(sA));
    Tensor tCrW = thr.make_fragment_B(thr.partition_B(sW));
    Tensor acc = partition_fragment_C(mma, Shape<_64, Int<TileN>>{});
    Tensor partial = make_fragment_like(acc);
    clear(acc);

    const int g = lane / 4, t = lane % 4, row = warp * 16 + g;
    const fused_probe::WeightScales ws(p, n0);
    // The converter's part: row cr of this CTA's share (global tile row rank R + cr), values c0 .. c0 + R - 1.
    const int cr = int(threadIdx.x) / T::kLanesPerRow, c0 = int(threadIdx.x) % T::kLanesPerRow * R;
    const int tile_row = int(rank) * R + cr;

    const auto convert = [&](const int kb) __attribute__((always_inline)) {
      const int s = kb % S;
      const uint32_t phase = uint32_t(kb / S) & 1;
      Barrier::wait(&x_full[s], phase);
      if (kb >= S) wait_cluster(&a_empty[s], phase ^ 1);
      // R bf16 values: R / 8 16-byte chunks of one swizzled box row.
      const uint32_t xs = cute::cast_smem_ptr_to_uint(smem_x + s * T::kXBytes) + (c0 >> 6) * (T::kXBytes / 2) +
                          cr * 128;
      uint32_t raw[R / 2];
      CUTLASS_PRAGMA_UNROLL
      for (int q = 0; q < R / 8; ++q) {
        const int chunk = ((c0 & 63) >> 3) + q;
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(raw[4 * q]), "=r"(raw[4 * q + 1]), "=r"(raw[4 * q + 2]), "=r"(raw[4 * q + 3])
                     : "r"(xs + ((chunk ^ (cr & 7)) << 4)));
      }
      float amax = 0.f;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < R / 2; ++i)
        amax = fmaxf(amax, fmaxf(fabsf(__uint_as_float(raw[i] << 16)), fabsf(__uint_as_float(raw[i] & 0xffff0000u))));
      CUTLASS_PRAGMA_UNROLL
      for (int d = 1; d < T::kLanesPerRow; d *= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, d));
      const float scale = fmaxf(amax, blockfp8::quant::kAmaxFloor) / blockfp8::quant::kFp8Max;
      const float rcp = __frcp_rn(scale);
      uint32_t packed[R / 4];
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < R / 4; ++i) {
        uint32_t word = 0;
        CUTLASS_PRAGMA_UNROLL
        for (int h = 0; h < 2; ++h) {
          const uint32_t v = raw[2 * i + h];
          const float2 q = fused_probe::exact_quotient_branchless(__uint_as_float(v << 16),
                                                                  __uint_as_float(v & 0xffff0000u), scale, rcp);
          word |= uint32_t(__nv_cvt_float2_to_fp8x2(q, __NV_SATFINITE, __NV_E4M3)) << (16 * h);
        }
        packed[i] = word;
      }
      __syncwarp();
      if (lane == 0) Barrier::arrive(&x_empty[s]);  // this warp's reads of the bf16 share are done
      // e4m3 bytes c0 .. c0 + R - 1 of tile row `tile_row`: 16-byte chunks (8 bytes at R = 8) of the swizzled row.
      const uint32_t a_row = cute::cast_smem_ptr_to_uint(smem_a + s * T::kABytes) + tile_row * 128;
      const uint32_t sx_at = cute::cast_smem_ptr_to_uint(smem_sx + s * kTok + tile_row);
      CUTLASS_PRAGMA_UNROLL
      for (uint32_t dst = 0; dst < uint32_t(C); ++dst) {
        if constexpr (R == 8) {
          const uint32_t at = a_row + ((((c0 >> 4) ^ (tile_row & 7)) << 4) | (c0 & 15));
          asm volatile("st.shared::cluster.v2.u32 [%0], {%1, %2};" ::"r"(cluster_address(at, dst)), "r"(packed[0]),
                       "r"(packed[1])
                       : "memory");
        } else {
          CUTLASS_PRAGMA_UNROLL
          for (int q = 0; q < R / 16; ++q) {
            const uint32_t at = a_row + ((((c0 >> 4) + q) ^ (tile_row & 7)) << 4);
            asm volatile("st.shared::cluster.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(cluster_address(at, dst)),
                         "r"(packed[4 * q]), "r"(packed[4 * q + 1]), "r"(packed[4 * q + 2]), "r"(packed[4 * q + 3])
                         : "memory");
          }
        }
        if (c0 == 0)
          asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(cluster_address(sx_at, dst)), "f"(scale) : "memory");
      }
      // The generic-proxy stores become visible to the wgmma (async proxy) that reads them after the barrier.
      asm volatile("fence.proxy.async.shared::cluster;" ::: "memory");
      __syncwarp();
      if (lane == 0)
        for (uint32_t dst = 0; dst < uint32_t(C); ++dst) remote_arrive(cute::cast_smem_ptr_to_uint(&a_full[s]), dst);
    };
    const auto issue = [&](const int kb) __attribute__((always_inline)) {
      const int s = kb % S;
      const uint32_t phase = uint32_t(kb / S) & 1;
      wait_cluster(&a_full[s], phase);
      Barrier::wait(&w_full[s], phase);
      fused_probe::wgmma_block(mma, tCrA(_, _, _, s), tCrW(_, _, _, s), partial);
    };
    // Block kb's wgmma done: its token scales read, its stages released (the A tile cluster-wide), promoted.
    const auto finish = [&](const int kb) __attribute__((always_inline)) {
      const int s = kb % S;
      const float w_lo = __ldg(ws.lo + kb), w_hi = __ldg(ws.hi + kb);
      const float t0 = smem_sx[s * kTok + row], t1 = smem_sx[s * kTok + row + 8];
      warpgroup_wait<0>();
      warpgroup_fence_operand(partial);
      __syncwarp();
      if (lane == 0) {
        Barrier::arrive(&w_empty[s]);
        for (uint32_t dst = 0; dst < uint32_t(C); ++dst) remote_arrive(cute::cast_smem_ptr_to_uint(&a_empty[s]), dst);
      }
      fused_probe::promote<TileN / 8>(acc, partial, ws.upper_group, t0, t1, w_lo, w_hi);
    };

    convert(0);
    for (int kb = 0; kb < p.k_blocks; ++kb) {
      issue(kb);
      if (kb + 1 < p.k_blocks) convert(kb + 1);
      finish(kb);
    }
    // 4-byte stores of bf16 pairs (TileN = 144 / 160 are not whole quad transposes); the same roundings as v1's.
    CUTLASS_PRAGMA_UNROLL
    for (int gi = 0; gi < TileN / 8; ++gi)
      CUTLASS_PRAGMA_UNROLL
      for (int h = 0; h < 2; ++h) {
        const int r = m0 + row + 8 * h, col = n0 + 8 * gi + 2 * t;
        if (r < p.m && col < p.n)
          *reinterpret_cast<uint32_t*>(p.out + int64_t(r) * p.n + col) =
              blockfp8::pack_pair<bf16>(acc(4 * gi + 2 * h), acc(4 * gi + 2 * h + 1));
      }
  }
  cluster_barrier();  // no CTA leaves while another may still write into or arrive on its shared memory
}

// The launcher run() times over copy i of x: the cluster kernel with C = N / TileN.
template <int C>
struct ClusterOf {
  template <int TileN>
  struct Launch {
    static constexpr int kXBoxRows = kTok / C;
    const std::vector<CUtensorMap>& x_maps;
    const CUtensorMap& w_map;
    const Params& p;
    void operator()(int i, cudaStream_t stream) const {
      const auto kernel = cluster_gemm<TileN, C>;
      CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, ClusterTile<TileN, C>::kSmem));
      cudaLaunchConfig_t config = {};
      config.gridDim = dim3(C, p.m_tiles, 1);
      config.blockDim = dim3(kThreads, 1, 1);
      config.dynamicSmemBytes = ClusterTile<TileN, C>::kSmem;
      config.stream = stream;
      cudaLaunchAttribute cluster;
      cluster.id = cudaLaunchAttributeClusterDimension;
      cluster.val.clusterDim.x = C, cluster.val.clusterDim.y = 1, cluster.val.clusterDim.z = 1;
      config.attrs = &cluster, config.numAttrs = 1;
      CHECK(cudaLaunchKernelEx(&config, kernel, x_maps[i], w_map, p));
    }
  };
};

}  // namespace cluster_probe

int main(int argc, char** argv) {
  using namespace fused_probe;
  using cluster_probe::ClusterOf;
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cublasHandle_t blas;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) return std::fprintf(stderr, "cublasCreate failed\n"), 1;
  FILE* json = argc > 1 ? open_probe_json(argv[1], sms, "") : std::fopen("/dev/null", "w");
  std::printf("%-22s %5s %5s %5s %4s %9s %9s %9s %8s %8s %9s %10s\n", "layer", "M", "N", "K", "W", "fused_us",
              "two_us", "bf16_us", "f/two", "f/bf16", "differ", "rel_err");
  bool first = true;
  // shapes.NARROW_LONG_K's layers as clusters of 4 (8 for 1280) whole-N tiles, at a mid and two prefill M.
  for (const int m : {256, 1024, 4096}) run<144, ClusterOf<4>::Launch>({"dsv3.kv_a.576x7168", 576, 7168, m, 144}, blas,
                                                                      json, first);
  for (const int m : {1024, 4096}) run<128, ClusterOf<4>::Launch>({"dsv3.4096x7168.tp8", 512, 7168, m, 128}, blas, json,
                                                                  first);
  for (const int m : {1024, 4096}) run<192, ClusterOf<4>::Launch>({"qwen3-8b.qkv.tp8", 768, 4096, m, 192}, blas, json,
                                                                  first);
  run<160, ClusterOf<8>::Launch>({"llama3-70b.qkv.tp8", 1280, 8192, 4096, 160}, blas, json, first);
  std::fprintf(json, "\n]}\n");
  std::fclose(json);
  std::printf("fused: a cluster along N converting each x value once; two: the extension's quantizer + tok64 (same "
              "width); bf16: cuBLAS on the dequantized weight; differ: fused outputs whose bits differ from two's\n");
  return 0;
}
