// Weight-only NVFP4 linear (W4A16) for GPUs without FP4 tensor cores (Ada, Hopper; the fallback
// elsewhere): the C++ boundary between ops.cpp and the kernels.
//
//   out[m, n] = global_scale[n] * sum_k x[m, k] * e2m1(b[n, k]) * e4m3(b_scale[n, k / 16]) (+ bias[n])
//
// x            bf16 or fp16 [m, k], row stride x_stride elements (K contiguous).
// b            uint8 [n, k / 2] contiguous, 16-byte aligned, in one of three packings (Problem::packing):
//              ModelOpt's (two E2M1 codes per byte, element 2i in the low nibble), paired (each 32-bit word's
//              bits permuted once at load, reference.pair_nvfp4_weight; decode.cuh) or fragment (the codes of
//              each lane's mma A fragment together, reference.fragment_nvfp4_weight; fragment.cuh).
// b_scale      [n, k / 16] contiguous, one scale per 16 values of a row, 8-byte aligned: e4m3 in the row
//              order (ModelOpt, paired), or exp8 bytes in the fragment order (fragment).
// Which rows read which packing: the SM90 wgmma rows the fragment packing only, the mma.sync W4A16 rows
// ModelOpt's and the paired one, the GEMV rows and the FMA fallback all three. layer_packing() says what the
// vLLM layer stores on a GPU.
// global_scale fp32 [n]: the checkpoint's weight_scale_2 per output row (fused shards keep theirs),
//              or a single value (global_scale_stride 0).
// bias         x's dtype [n] or null; added in fp32 before the one rounding of the output.
// out          x's dtype [m, n], row stride out_stride elements. Written in full, never read.
// Every kernel row computes e2m1 * e4m3 * 2^-7 exactly in x's 16-bit type (<= 7 significant bits, in the
// normal range), multiplies it by x in fp32 (exact), accumulates in fp32 and applies
// global_scale * 2^7 once per output. The dequantize row (dequantizes(); large M on SM90) instead rounds each weight
// times its global scale to 16 bits and leaves the product to cuBLAS (then adds the bias). Activations are never
// quantized (the checkpoint's input_scale is for W4A4 kernels and unused here).
//
// Valid problems: k % 32 == 0, m, n, k < 2^30; the fragment packing n % 16 == 0 and k % 64 == 0. The
// tensor-core rows also need 16-byte aligned x rows (the fragment GEMV 4-byte) and, on the row-contiguous
// packings, k % 128 == 0. No torch types here: ops.cpp converts tensors into a Problem.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "../common/tile_row.h"

namespace blockfp8::fp4 {

enum class Packing : int { kModelOpt = 0, kPaired = 1, kFragment = 2 };

struct Problem {
  const void* x = nullptr;            // bf16/fp16 [m, k], row stride x_stride
  const uint8_t* b = nullptr;         // packed e2m1 [n, k / 2]
  const uint8_t* b_scale = nullptr;   // e4m3 [n, k / 16]
  const float* global_scale = nullptr;  // fp32 [n], or one value when global_scale_stride == 0
  int64_t global_scale_stride = 1;        // 1: one per output row; 0: one for the whole weight
  const void* bias = nullptr;         // x's dtype [n] or null
  void* out = nullptr;                // x's dtype [m, n], row stride out_stride
  int64_t m = 0, n = 0, k = 0;
  int64_t x_stride = 0, out_stride = 0;  // in elements
  bool bf16 = true;                      // false: fp16 (x, bias and out)
  Packing packing = Packing::kModelOpt;  // b's and b_scale's packing (see above)
  int sm_count = 0;                      // multiprocessors (grid sizing, K splits)
  int max_smem = 0;                      // opt-in shared memory per block, bytes (rows that need more reject)
  int cc = 0;                            // compute capability, major * 10 + minor (the SM90 wgmma rows need 90)
  void* workspace = nullptr;             // >= workspace_bytes(row, problem) bytes, 16-byte aligned
};

// The packing the vLLM layer stores for an [n, k] weight on a GPU of compute capability cc (major * 10 + minor):
// fragment where this build has the SM90 wgmma rows, cc is 90 and the shape tiles (n % 16, k % 64), else paired.
// (SM120's native W4A4 path reads ModelOpt's packing; the layer decides that one.)
Packing layer_packing(int cc, int64_t n, int64_t k);

// Rows of the table in selection order (data at the top of sm80.cu; the last one is unbounded).
int num_rows();
const TileRow& row(int i);

// nullptr if row i can run p, else a sentence saying why not (static storage, never freed).
// Reads pointers only for their alignment, so a Problem with null pointers can be asked.
const char* rejects(int i, const Problem& p);

// First row with max_m >= p.m that does not reject p; -1 if none.
int select(const Problem& p);

// Scratch row i needs for p (fp32 partials of a K split), 0 for most rows; the op allocates it.
size_t workspace_bytes(int i, const Problem& p);

// Whether row i only dequantizes: its launch writes the weight, x's 16-bit type [n, k] with the global scale folded
// in, into the workspace (workspace_bytes), and the op multiplies x by it (cuBLAS) and adds the bias.
bool dequantizes(int i);

// The SM90 wgmma tile of `tok` tokens' K split for p as JSON (host_ops.nvfp4_wgmma_plan): "" where the build has no
// wgmma rows, {"error": ...} for a tile that does not exist.
std::string wgmma_plan_json(int tok, const Problem& p);

// Enqueues row i on stream s. Never synchronizes and never allocates (CUDA-graph capturable).
// Returns cudaErrorInvalidValue if rejects(i, p) != nullptr, cudaSuccess without a launch when
// m == 0 or n == 0, otherwise cudaGetLastError() after the launch.
cudaError_t launch(int i, const Problem& p, cudaStream_t s);

}  // namespace blockfp8::fp4
