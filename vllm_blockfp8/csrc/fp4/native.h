// Native NVFP4 x NVFP4 (W4A4) on GPUs with FP4 tensor cores (SM120): the C++ boundary between ops.cpp and
// the kernels. Three pieces:
//   quantize  x bf16/fp16 [m, k] -> packed E2M1 [m, k / 2] + one E4M3 scale per 16 values, the scales written
//             straight into the swizzled layout below (arch-neutral CUDA, fp4/nvfp4_quant.cu)
//   swizzle   a weight's plain e4m3 [n, k / 16] scales -> the same layout, once at load (fp4/nvfp4_quant.cu)
//   gemm      out[m, n] = alpha * sum_k e2m1(a) * sa * e2m1(b) * sb through CUTLASS's SM120 block-scaled
//             collective (fp4/sm120/, built only for sm_120a)
//
// Scale convention: every scale multiplies to dequantize. input_scale is the checkpoint's (ModelOpt) activation
// scale amax / (6 * 448), the reciprocal of what vLLM's scaled_fp4_quant takes; alpha = input_scale *
// weight_scale_2, one fp32 on the device (read by the epilogue: no host sync, graph capturable).
//
// Quantization rule (bit for bit reference.quantize_nvfp4_activations), per 16 consecutive values of a row:
//   amax = max |x|                                    (fp32, exact)
//   s    = e4m3(min(amax / 6 / input_scale, 448))     (two IEEE fp32 divisions in this order, round to nearest
//                                                      even, e4m3 subnormals kept)
//   d    = float(s) * input_scale                     (one fp32 product)
//   code = d > 0 ? e2m1(x / d) : 0                    (IEEE fp32 division; nearest, ties to even; saturates at 6)
//
// Scale-factor layout (CUTLASS Sm1xxBlockScaledConfig<16>: SfKMajorAtom tiled K-first by tile_to_shape with
// Step<_2,_1,_3>). Rows (m or n) pad to a multiple of 128, scale columns (k / 16) to a multiple of 4; the
// padded buffer is atoms of 128 rows x 4 columns = 512 bytes, atom (r / 128, c / 4) at
// ((r / 128) * (cols / 4) + c / 4) * 512, and inside an atom
//   offset(r, c) = (r % 32) * 16 + ((r % 128) / 32) * 4 + c % 4.
// Padding bytes are written as 0 (an e4m3 0): the GEMM multiplies the TMA's zero-filled out-of-range K by
// them, and a NaN byte there would poison in-range outputs.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../common/tile_row.h"

namespace blockfp8::fp4::native {

constexpr int kGroup = 16;         // values per scale
constexpr int64_t kSfAtomRows = 128;
constexpr int64_t kSfAtomCols = 4;

#ifdef __CUDACC__
#define BLOCKFP8_HD __host__ __device__
#else
#define BLOCKFP8_HD
#endif

// Padded rows and scale columns of a tensor's swizzled scales.
BLOCKFP8_HD inline int64_t sf_rows(int64_t rows) { return (rows + kSfAtomRows - 1) / kSfAtomRows * kSfAtomRows; }
BLOCKFP8_HD inline int64_t sf_cols(int64_t k) { return (k / kGroup + kSfAtomCols - 1) / kSfAtomCols * kSfAtomCols; }

// Byte offset of scale (row r, scale column c) in the swizzled buffer of a tensor with `cols` padded columns.
BLOCKFP8_HD inline int64_t sf_offset(int64_t r, int64_t c, int64_t cols) {
  return ((r / 128) * (cols / 4) + c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + c % 4;
}

struct QuantProblem {
  const void* x = nullptr;           // bf16/fp16 [m, k], row stride x_stride (16-byte aligned rows)
  const float* input_scale = nullptr;  // fp32, one value (multiplies to dequantize)
  uint8_t* q = nullptr;              // packed e2m1 [m, k / 2]
  uint8_t* sf = nullptr;             // e4m3 [sf_rows(m) * sf_cols(k)] swizzled, padding written as 0
  int64_t m = 0, k = 0, x_stride = 0;
  bool bf16 = true;
};

// k % 32 == 0; every byte of q and sf is written. Never synchronizes or allocates.
cudaError_t launch_quantize(const QuantProblem& p, cudaStream_t s);

struct SwizzleProblem {
  const uint8_t* scale = nullptr;  // e4m3 [rows, k / 16] row-major
  uint8_t* out = nullptr;          // e4m3 [sf_rows(rows) * sf_cols(k)], padding written as 0
  int64_t rows = 0, k = 0;
};

cudaError_t launch_swizzle(const SwizzleProblem& p, cudaStream_t s);

// ---------------------------------------------------------------------------------------------
// The SM120 GEMM (fp4/sm120/table.cpp, only where the build has sm_120a: BLOCKFP8_HAS_SM120_NVFP4)
// ---------------------------------------------------------------------------------------------

struct GemmProblem {
  const uint8_t* a = nullptr;     // packed e2m1 [m, k / 2], 16-byte aligned
  const uint8_t* a_sf = nullptr;  // swizzled e4m3, [sf_rows(m) * sf_cols(k)]
  const uint8_t* b = nullptr;     // packed e2m1 [n, k / 2], 16-byte aligned
  const uint8_t* b_sf = nullptr;  // swizzled e4m3, [sf_rows(n) * sf_cols(k)]
  const float* alpha = nullptr;   // fp32, one value on the device
  void* d = nullptr;              // bf16/fp16 [m, n] contiguous
  int64_t m = 0, n = 0, k = 0;
  bool bf16 = true;
  void* workspace = nullptr;      // >= workspace_bytes(row, p)
};

int num_rows();
const TileRow& row(int i);
const char* rejects(int i, const GemmProblem& p);  // nullptr if row i can run p
int select(const GemmProblem& p);                  // first fitting row, -1 if none
size_t workspace_bytes(int i, const GemmProblem& p);
cudaError_t launch(int i, const GemmProblem& p, cudaStream_t s);

// The decode GEMV keeps M <= 16 (no activation quant, plain scales); above it SM120 goes native.
constexpr int64_t kNativeMinM = 17;

// Whether nvfp4_linear runs quantize + native GEMM for this call: nullptr if yes, else why not (static text).
// cc is major * 10 + minor. Reads BLOCKFP8_NVFP4_W4A16 once per process.
const char* path_rejects(int cc, int64_t m, int64_t n, int64_t k);

// First-use self-check (fp4/first_use.cpp, shared registry common/first_use.h): the native rows have never run on
// SM120 hardware here. Whether row i may run on this call on a GPU of compute capability cc, on stream s: true where
// the row needs no check (cc != 120 without BLOCKFP8_SELF_CHECK=always) or passed it; false where it failed its check
// (one warning, for the process) or is unchecked while s is capturing a CUDA graph. The first eligible call runs the
// check (synchronizing s). Callers then take their safe path: nvfp4_linear the W4A16 path, nvfp4_gemm the reference
// kernel (native_reference.h).
bool native_row_usable(int i, int cc, cudaStream_t s);

// Runs row i's check now on the current device and stream s, outside the registry (no state, no warning): "" on a
// match, else what went wrong. i = -1 checks the reference kernel against itself (any GPU: the H200 tests the
// yardstick, the fill and the comparison with it); corrupt perturbs the output as BLOCKFP8_SELF_CHECK_CORRUPT does.
std::string check_row(int i, bool corrupt, cudaStream_t s);

// The isolated check (vllm_blockfp8/first_use.py; gemm/first_use.h says why): the rows a device of compute
// capability cc would check and has not yet, and an outcome decided in the child process recorded here.
std::vector<int> rows_to_check(int cc);
void record_check(int i, const std::string& why);

// The native rows' check states as JSON: [{"name", "state": "unchecked" | "passed" | "failed", "detail"}].
std::string self_check_json();

}  // namespace blockfp8::fp4::native
