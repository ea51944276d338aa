// The first-use self-check's row registry, shared by every family whose rows have never run on their hardware here
// (DESIGN.md: such a row "checks itself against the reference on first use and falls back with one warning on a
// mismatch"): the W8A8 GEMM tables (gemm/first_use.*) and the SM120 native NVFP4 rows (fp4/first_use.cpp).
//
// The family decides whether a row needs a check (its arch rule, or BLOCKFP8_SELF_CHECK=always) and supplies the
// check itself (a small deterministic problem against its arch-neutral reference kernel); this registry keeps each
// row's state (unchecked -> passed | failed, for the process), runs one check at a time, never inside a CUDA graph
// capture, prints the one warning of a failed row, and reads the test switches (docs/DEVELOPING.md), once:
//   BLOCKFP8_SELF_CHECK=always          the families check every row they own, hardware-tested ones included
//   BLOCKFP8_SELF_CHECK_CORRUPT=<row>   the check of the row of that name perturbs its output (forced mismatch)
#pragma once

#include <functional>
#include <string>
#include <utility>

#include <cuda_runtime_api.h>

namespace blockfp8::first_use {

// A row as the registry keys it: (family, table, index); name is for the warning and the corrupt switch.
struct Row {
  const char* family;  // "gemm", "nvfp4"
  int table;           // the family's table: the GEMM's arch; 120 for the native NVFP4 rows
  int index;
  const char* name;
};

// The family's words in the warning: what the row is ("W8A8 GEMM") and what serves its calls after it failed.
struct Words {
  const char* what;
  const char* fallback;
};

// Runs the row once on the family's check problem on the stream given to usable() and synchronizes it. corrupt:
// BLOCKFP8_SELF_CHECK_CORRUPT names this row. Returns "" on a match, else what went wrong (one line).
using Check = std::function<std::string(bool corrupt)>;

// BLOCKFP8_SELF_CHECK=always (read once).
bool check_always();

enum class State : int { kUnchecked = 0, kPassed = 1, kFailed = 2 };

// The row's state: lock-free (an atomic read once the row's table is known), so the hot path of a checked row costs
// no lock. A row past the registry's capacity (16 tables of 64 rows) reads as passed: never checked.
State state(const Row& row);

// The slow path of usable(): the capture rule, then the check under the registry's lock.
bool check_now(const Row& row, const Words& words, cudaStream_t s, const Check& check);

// Whether the row may run on this call. Passed: true; failed: false. Unchecked: false while stream s is capturing a
// CUDA graph (a check never runs inside a capture: the family's safe path serves that call, the next eager call
// checks), else runs `check` now (one check at a time in the process), records the outcome, prints one warning on a
// mismatch, and returns whether it passed. Call it only for rows that need a check. A template so that the check's
// std::function is built only on the slow path.
template <typename F>
bool usable(const Row& row, const Words& words, cudaStream_t s, F&& check) {
  const State st = state(row);
  if (st != State::kUnchecked) return st == State::kPassed;
  return check_now(row, words, s, Check(std::forward<F>(check)));
}

// Records a row's outcome decided outside this process (the isolated check, vllm_blockfp8/first_use.py): why = ""
// passed, else failed with one warning. A row already checked keeps its state.
void record(const Row& row, const Words& words, const std::string& why);

// Whether BLOCKFP8_SELF_CHECK_CORRUPT names this row (the checks' test switch).
bool corrupt_for(const char* name);

// The states of rows 0..count-1 of (family, table) as JSON: [{"name", "state": "unchecked" | "passed" | "failed",
// "detail"}], detail being the failed check's line ("" otherwise).
std::string states_json(const char* family, int table, int count, const std::function<const char*(int)>& name);

}  // namespace blockfp8::first_use
