// First-use self-check of the SM120 native NVFP4 rows (native.h: native_row_usable). The rows have never run on
// SM120 hardware here, so on a GPU of compute capability 12.0 (or everywhere with BLOCKFP8_SELF_CHECK=always) the
// first call about to run a row runs it once on a deterministic problem against the arch-neutral reference kernel
// (native_reference.h), in both output types. The row states, the one warning and the capture rule are the shared
// registry's (common/first_use.h). Host logic plus cudaMalloc'd scratch, compiled into every build.
#include <cstdio>
#include <cstring>
#include <vector>

#include "../common/first_use.h"
#include "native.h"
#include "native_reference.h"

namespace blockfp8::fp4::native {
namespace {

constexpr const char* kFamily = "nvfp4";
constexpr int kTable = 120;  // one table: the SM120 rows

size_t up(size_t x) { return (x + 255) / 256 * 256; }  // every scratch part 256-byte aligned (TMA needs 16)

}  // namespace

// The check problem: M in the row's bucket (its largest M less 3, so the last 128-row tile is ragged; 197 for the
// unbounded row and the reference: two M tiles, the second ragged), N = 288 (two full 128-wide tiles and a 32-wide
// one), K = 512 (two 256-deep and four 128-deep K tiles, 32 scale groups). Row i < 0: the reference kernel writes D
// (the yardstick checked against itself: the H200 tests the whole check with it).
std::string check_row(int i, bool corrupt, cudaStream_t s) {
  if (i >= num_rows()) return "row index out of range";
  GemmProblem p;
  const int64_t max_m = i < 0 ? kUnboundedM : row(i).max_m;
  p.m = max_m == kUnboundedM ? 197 : (max_m - 3 > kNativeMinM ? max_m - 3 : kNativeMinM);
  p.n = 288, p.k = 512;
  const size_t mn = size_t(p.m * p.n), cols = size_t(sf_cols(p.k));
  size_t ws = 0;  // null pointers pass the alignment checks: sizes only; each output type's instantiation asks
  for (int t = 0; t < 2 && i >= 0; ++t) {
    p.bf16 = t == 0;
    const size_t need = workspace_bytes(i, p);
    ws = need > ws ? need : ws;
  }
  const size_t off_b = up(size_t(p.m * p.k / 2)), off_sa = off_b + up(size_t(p.n * p.k / 2));
  const size_t off_sb = off_sa + up(size_t(sf_rows(p.m)) * cols), off_alpha = off_sb + up(size_t(sf_rows(p.n)) * cols);
  const size_t off_d = off_alpha + 256, off_ref = off_d + up(mn * 2), off_mag = off_ref + up(mn * 4);
  const size_t off_res = off_mag + up(mn * 4), off_ws = off_res + 256;
  uint8_t* buf = nullptr;
  cudaError_t err = cudaMalloc(reinterpret_cast<void**>(&buf), off_ws + ws);
  if (err != cudaSuccess) return std::string("scratch allocation failed: ") + cudaGetErrorString(err);
  p.a = buf, p.b = buf + off_b, p.a_sf = buf + off_sa, p.b_sf = buf + off_sb;
  p.alpha = reinterpret_cast<const float*>(buf + off_alpha);
  p.d = buf + off_d;
  p.workspace = ws > 0 ? buf + off_ws : nullptr;
  float* ref = reinterpret_cast<float*>(buf + off_ref);
  float* mag = reinterpret_cast<float*>(buf + off_mag);
  unsigned* result = reinterpret_cast<unsigned*>(buf + off_res);  // [failing, worst ratio] per output type
  unsigned host[4] = {0, 0, 0, 0};
  std::string out;
  if (const char* why = i < 0 ? nullptr : rejects(i, p)) {
    out = std::string("the check problem is rejected: ") + why;
  } else {
    err = cudaMemsetAsync(result, 0, sizeof host, s);
    if (err == cudaSuccess) err = launch_fill_check_problem(p, s);
    GemmProblem fp32_only = p;  // the reference writes its fp32 result and magnitudes, not D
    fp32_only.d = nullptr;
    if (err == cudaSuccess) err = launch_reference(fp32_only, ref, mag, s);
    // Both output types: each is its own instantiation of the row (its epilogue converts differently).
    for (int t = 0; t < 2 && err == cudaSuccess; ++t) {
      p.bf16 = t == 0;
      err = i < 0 ? launch_reference(p, nullptr, nullptr, s) : launch(i, p, s);
      if (err == cudaSuccess) err = launch_compare(p, ref, mag, corrupt, result + 2 * t, s);
    }
    if (err == cudaSuccess) err = cudaMemcpyAsync(host, result, sizeof host, cudaMemcpyDeviceToHost, s);
    if (err == cudaSuccess) err = cudaStreamSynchronize(s);
    if (err != cudaSuccess) {
      // Consume a non-sticky launch error (e.g. no kernel image for this GPU): the fallback launched next checks
      // cudaGetLastError and must not see the row's error as its own.
      cudaGetLastError();
      out = std::string("CUDA error: ") + cudaGetErrorString(err);
    } else {
      for (int t = 0; t < 2 && out.empty(); ++t) {
        if (host[2 * t] == 0) continue;
        float worst;
        std::memcpy(&worst, &host[2 * t + 1], 4);
        char msg[200];
        std::snprintf(msg, sizeof msg,
                      "%u of %lld %s outputs (M=%lld N=%lld K=%lld) outside tolerance (worst |d - ref| = %.3g x "
                      "tolerance)%s",
                      host[2 * t], static_cast<long long>(mn), t == 0 ? "bf16" : "fp16", static_cast<long long>(p.m),
                      static_cast<long long>(p.n), static_cast<long long>(p.k), worst,
                      corrupt ? " [BLOCKFP8_SELF_CHECK_CORRUPT]" : "");
        out = msg;
      }
    }
  }
  cudaFree(buf);
  return out;
}

namespace {
const first_use::Words kWords{"native NVFP4 GEMM",
                              "nvfp4_linear runs the weight-only W4A16 path, nvfp4_gemm the reference kernel"};
bool needs_check(int cc) { return cc == 120 || first_use::check_always(); }
}  // namespace

bool native_row_usable(int i, int cc, cudaStream_t s) {
  if (i < 0 || i >= num_rows() || !needs_check(cc)) return true;
  return first_use::usable({kFamily, kTable, i, row(i).name}, kWords, s,
                           [&](bool corrupt) { return check_row(i, corrupt, s); });
}

std::vector<int> rows_to_check(int cc) {
  std::vector<int> out;
  for (int i = 0; needs_check(cc) && i < num_rows(); ++i)
    if (first_use::state({kFamily, kTable, i, row(i).name}) == first_use::State::kUnchecked) out.push_back(i);
  return out;
}

void record_check(int i, const std::string& why) {
  if (i >= 0 && i < num_rows()) first_use::record({kFamily, kTable, i, row(i).name}, kWords, why);
}

std::string self_check_json() {
  return first_use::states_json(kFamily, kTable, num_rows(), [](int i) { return row(i).name; });
}

}  // namespace blockfp8::fp4::native
