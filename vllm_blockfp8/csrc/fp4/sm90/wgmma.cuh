// SM90 (sm_90a only) warpgroup MMA primitives of the NVFP4 W4A16 wgmma kernel (w4a16_wgmma.cuh): the
// register-A wgmma m64nNk16 (N = 32, 64, 128, 256; bf16 or f16 inputs, fp32 accumulators), its fence / commit / wait,
// the shared-memory descriptor of a K-major 128-byte-swizzled B tile, the async-proxy fence, and the thread-block
// cluster pieces of the in-cluster K-split reduction (rank, barrier, a read of another CTA's shared memory).
//
// PTX: wgmma.mma_async.sync.aligned.m64nNk16.f32.T.T {d}, {a0..a3}, b-desc, scale-d, imm-scale-a, imm-scale-b,
// imm-trans-b (the register-A form has no trans-a: A is K-major by definition). scale-d is a predicate, set to 1
// (the kernel zeroes its accumulators instead: a K split may have no stage at all). imm-trans-b = 0: B is K-major.
// Fragment layouts (PTX ISA "wgmma register fragments"; cute's ALayout_64x16 / CLayout_64xN, mma_traits_sm90_gmma.hpp):
// warp w of the warpgroup, lane (g = lane / 4, t = lane % 4):
//   A (64 x 16, 16-bit): a[0] = (row 16w + g, k 2t, 2t + 1), a[1] = (row 16w + g + 8, k 2t, 2t + 1),
//                        a[2] = (row 16w + g, k 2t + 8, 2t + 9), a[3] = (row 16w + g + 8, k 2t + 8, 2t + 9),
//                        the lower k in the low half (mma.sync m16n8k16's A fragment, per warp).
//   D (64 x N, fp32):    d[j] = (row 16w + g + 8 ((j / 2) % 2), column 8 (j / 4) + 2t + j % 2).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace blockfp8::fp4::sm90 {

// Shared-memory matrix descriptor (cute's GmmaDescriptor): bits 0-13 start address >> 4, 16-29 leading byte offset
// >> 4, 32-45 stride byte offset >> 4, 49-51 base offset, 62-63 layout (1 = 128-byte swizzle). For a K-major
// 128-byte-swizzled tile whose rows are 128 bytes (64 16-bit values of K) the stride byte offset is 1024 (8 rows,
// one swizzle atom), the leading byte offset is unused (1 by convention) and the base offset 0 (the atom is
// 1024-byte aligned). A k16 step within the 64-wide row starts 32 bytes further: the hardware applies the swizzle to
// the absolute address (16-byte chunk bits 4-6 ^= row bits 7-9), which is why the tile must be 1024-byte aligned.
__host__ __device__ constexpr uint64_t sw128_kmajor_desc(uint32_t smem_address) {
  return uint64_t((smem_address >> 4) & 0x3fffu) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Pins an accumulator after a wait: its later readers cannot be scheduled above the wait (the compiler does not
// know the wgmma writes it asynchronously).
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// Orders this thread's completed generic-proxy writes to shared memory (cp.async) before later async-proxy reads
// (wgmma's B operand); a barrier then publishes them to the warpgroups.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Thread-block clusters (PTX ISA "distributed shared memory"): this CTA's rank and the cluster's CTA count; a
// barrier of every thread of the cluster whose release / acquire makes each CTA's earlier shared-memory writes
// visible to the others' later reads; a 16-byte read of CTA `rank`'s shared memory at the address this CTA's own
// window gives the same variable (mapa translates it into the cluster window).
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t cluster_nctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ float4 ld_shared_cluster_f4(uint32_t smem_address, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_address), "r"(rank));
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(remote)
               : "memory");
  return v;
}
// Four 8 x 8 16-bit matrices to shared memory, transposed: register i of lane (g, t) holds row g, columns 2t and 2t + 1
// of matrix i (the mma / wgmma D-fragment shape), and lane 8i + r gives the address of row r of matrix i as stored,
// i.e. of its column r: 8 consecutive 16-bit values, 16 bytes.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t smem_address, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_address),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

// d (64 x N fp32) += A (64 x 16, registers) * B (16 x N, shared memory via desc). One specialization per (N, input
// type); the asm operand lists are spelled out because inline asm takes no arrays.
template <int N, typename T>
struct Wgmma;

// The register-A wgmma of one tile width for both input types (PTX_T: "bf16" or "f16"); D_REGS and D_OPERANDS list
// the N / 2 accumulators (each width's list extends the narrower one's; the operands in parentheses, so that they
// pass through BLOCKFP8_WGMMA_BOTH as one argument), P the index of the scale-d operand.
#define BLOCKFP8_UNPAREN(...) __VA_ARGS__
#define BLOCKFP8_WGMMA(N, T, PTX_T, D_REGS, D_OPERANDS, A_REGS, DESC, P)                                        \
  template <>                                                                                                   \
  struct Wgmma<N, T> {                                                                                          \
    static __device__ __forceinline__ void mma(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc) {    \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " P ", 0;\n"                                            \
                   "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX_T "." PTX_T " "                     \
                   "{" D_REGS "}, {" A_REGS "}, " DESC ", p, 1, 1, 0;\n}\n"                                 \
                   : BLOCKFP8_UNPAREN D_OPERANDS                                                                \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(1));                           \
    }                                                                                                           \
  };
#define BLOCKFP8_WGMMA_BOTH(N, D_REGS, D_OPERANDS, A_REGS, DESC, P)                   \
  BLOCKFP8_WGMMA(N, __nv_bfloat16, "bf16", D_REGS, D_OPERANDS, A_REGS, DESC, P) \
  BLOCKFP8_WGMMA(N, __half, "f16", D_REGS, D_OPERANDS, A_REGS, DESC, P)
#define BLOCKFP8_D32_REGS "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define BLOCKFP8_D32_OPERANDS \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
  "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
BLOCKFP8_WGMMA_BOTH(32, BLOCKFP8_D32_REGS, (BLOCKFP8_D32_OPERANDS), "%16, %17, %18, %19", "%20", "%21")
#define BLOCKFP8_D64_REGS \
  BLOCKFP8_D32_REGS ", " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define BLOCKFP8_D64_OPERANDS \
  BLOCKFP8_D32_OPERANDS, \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
BLOCKFP8_WGMMA_BOTH(64, BLOCKFP8_D64_REGS, (BLOCKFP8_D64_OPERANDS), "%32, %33, %34, %35", "%36", "%37")
#define BLOCKFP8_D128_REGS \
  BLOCKFP8_D64_REGS ", " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52," \
  "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define BLOCKFP8_D128_OPERANDS \
  BLOCKFP8_D64_OPERANDS, \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
BLOCKFP8_WGMMA_BOTH(128, BLOCKFP8_D128_REGS, (BLOCKFP8_D128_OPERANDS), "%64, %65, %66, %67", "%68", "%69")
#define BLOCKFP8_D256_REGS \
  BLOCKFP8_D128_REGS ", " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84," \
  "%85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104," \
  "%105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122," \
  "%123, %124, %125, %126, %127"
#define BLOCKFP8_D256_OPERANDS \
  BLOCKFP8_D128_OPERANDS, \
  "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
  "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
  "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
  "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
  "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
  "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), \
  "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), \
  "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), \
  "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
BLOCKFP8_WGMMA_BOTH(256, BLOCKFP8_D256_REGS, (BLOCKFP8_D256_OPERANDS), "%128, %129, %130, %131", "%132", "%133")
#undef BLOCKFP8_D32_REGS
#undef BLOCKFP8_D32_OPERANDS
#undef BLOCKFP8_D64_REGS
#undef BLOCKFP8_D64_OPERANDS
#undef BLOCKFP8_D128_REGS
#undef BLOCKFP8_D128_OPERANDS
#undef BLOCKFP8_D256_REGS
#undef BLOCKFP8_D256_OPERANDS
#undef BLOCKFP8_WGMMA_BOTH
#undef BLOCKFP8_WGMMA
#undef BLOCKFP8_UNPAREN

}  // namespace blockfp8::fp4::sm90
