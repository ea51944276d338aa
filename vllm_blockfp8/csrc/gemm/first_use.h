// First-use self-check of the W8A8 GEMM rows that have never run on their hardware here (DESIGN.md): the SM89 table
// on an SM89 GPU and the SM120 table on an SM120 GPU (SM90 is hardware-tested). The first call that is about to run
// such a row runs it once on a small deterministic problem against the reference kernel (reference.h); a mismatch
// prints one warning naming the row and disables the row for the process: the direct GEMM op then runs the
// reference kernel and the linear op dequantizes + cuBLAS. Arch-neutral: every table's rows go through it. The row
// states, the warning and the capture rule are the registry's shared with the native NVFP4 rows (common/first_use.h).
//
// Test switches (docs/DEVELOPING.md, read once by the registry):
//   BLOCKFP8_SELF_CHECK=always          check the rows of every table, hardware-tested ones and forced tables too
//   BLOCKFP8_SELF_CHECK_CORRUPT=<row>   perturb that row's output inside its check (forces the mismatch path)
#pragma once

#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "gemm.h"

namespace blockfp8::gemm {

// Whether row `row` of the table p.arch may run on this call: true where the row needs no check or passed it;
// false where it failed (for the process) or where it is unchecked and stream s is capturing a CUDA graph (a check
// never runs inside a capture: the safe path serves that call, the next eager call checks). Runs the check on s
// (synchronizing s) on the first eligible call. p supplies the table (p.arch) and sm_count only.
bool row_usable(const Problem& p, int row, int device_cc, cudaStream_t s);

// The isolated check (vllm_blockfp8/first_use.py runs the checks in a child process before the first call, so that
// a row that crashes cannot take the serving process with it): the rows of table `arch` that a device of compute
// capability device_cc would check and has not yet; one row's check run now on stream s, outside the registry ("" or
// what went wrong; BLOCKFP8_SELF_CHECK_CORRUPT applies); and an outcome decided in the child, recorded here.
std::vector<int> rows_to_check(int arch, int device_cc);
std::string check_row_now(int arch, int row_index, int sm_count, cudaStream_t s);
void record_check(int arch, int row_index, const std::string& why);

// The rows' check states of table `arch` as JSON: [{"name", "state": "unchecked" | "passed" | "failed",
// "detail"}].
std::string self_check_json(int arch);

}  // namespace blockfp8::gemm
