// First-use self-check of the W8A8 GEMM rows (first_use.h has the rule and the switches). Host logic plus
// cudaMalloc'd scratch; never runs inside a CUDA graph capture.
#include "first_use.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "reference.h"

namespace blockfp8::gemm {
namespace {

enum State : int { kUnchecked = 0, kPassed = 1, kFailed = 2 };
constexpr int kMaxRows = 64;

int slot(int arch) { return arch == 89 ? 0 : arch == 90 ? 1 : arch == 120 ? 2 : -1; }

struct RowState {
  std::atomic<int> state{kUnchecked};
  char detail[160] = {};
};
RowState g_rows[3][kMaxRows];
std::mutex g_mu;  // one check at a time

bool check_always() {
  static const bool on = [] {
    const char* v = std::getenv("BLOCKFP8_SELF_CHECK");
    return v != nullptr && std::strcmp(v, "always") == 0;
  }();
  return on;
}

const char* corrupt_row() {
  static const char* name = std::getenv("BLOCKFP8_SELF_CHECK_CORRUPT");
  return name;
}

// Tables that have never run on their own hardware here check themselves there; BLOCKFP8_SELF_CHECK=always: all.
bool needs_check(int arch, int device_cc) {
  return check_always() || (arch == device_cc && (arch == 89 || arch == 120));
}

// Runs row `row` of table `arch` once on a deterministic problem: M in the row's bucket (its largest M less 3, so
// the last token tile is ragged; 197 for the unbounded row), N = 264 (two full 128-wide weight tiles and a ragged
// 8-wide one), K = 512 (four scale blocks); compares to the reference. Returns "" on a match, else what went wrong.
std::string run_check(int arch, int row, int sm_count, cudaStream_t s) {
  const TileRow& info = gemm::row(arch, row);
  Problem p{};
  p.arch = arch, p.sm_count = sm_count, p.out_bf16 = true;
  p.m = info.max_m == kUnboundedM ? 197 : (info.max_m > 3 ? info.max_m - 3 : 1);
  p.n = 264, p.k = 512;
  p.a_scale_ld = (p.m + 3) / 4 * 4;
  const size_t kb = size_t(p.k / 128), mn = size_t(p.m * p.n);
  auto up = [](size_t x) { return (x + 255) / 256 * 256; };
  const size_t off_b = up(size_t(p.m * p.k)), off_sa = off_b + up(size_t(p.n * p.k));
  const size_t off_sb = off_sa + up(p.a_scale_ld * kb * 4), off_d = off_sb + up(size_t((p.n + 127) / 128) * kb * 4);
  const size_t off_ref = off_d + up(mn * 2), off_abs = off_ref + up(mn * 4), off_res = off_abs + up(mn * 4);
  const size_t off_ws = off_res + 256;
  const Plan planned = plan(p, row);  // sizes only: the workspace is known before the pointers
  const size_t ws = workspace_bytes(p, planned);
  uint8_t* buf = nullptr;
  cudaError_t err = cudaMalloc(reinterpret_cast<void**>(&buf), off_ws + ws);
  if (err != cudaSuccess) return std::string("scratch allocation failed: ") + cudaGetErrorString(err);
  p.a = buf, p.b = buf + off_b;
  p.a_scale = reinterpret_cast<float*>(buf + off_sa), p.b_scale = reinterpret_cast<float*>(buf + off_sb);
  p.d = buf + off_d;
  p.workspace = ws > 0 ? buf + off_ws : nullptr, p.workspace_size = ws;
  float* ref = reinterpret_cast<float*>(buf + off_ref);
  float* abs_dot = reinterpret_cast<float*>(buf + off_abs);
  unsigned* result = reinterpret_cast<unsigned*>(buf + off_res);
  unsigned host[2] = {0, 0};
  std::string out;
  const bool corrupt = corrupt_row() != nullptr && std::strcmp(corrupt_row(), info.name) == 0;
  if (const char* why = rejects(p)) {
    out = std::string("the check problem is rejected: ") + why;
  } else {
    err = cudaMemsetAsync(result, 0, 8, s);
    if (err == cudaSuccess) err = launch_fill_check_problem(p, s);
    if (err == cudaSuccess) err = launch(p, planned, s);
    Problem fp32_only = p;  // the reference writes its fp32 result and magnitudes, not D
    fp32_only.d = nullptr;
    if (err == cudaSuccess) err = launch_reference(fp32_only, ref, abs_dot, s);
    if (err == cudaSuccess) err = launch_compare(p, ref, abs_dot, corrupt, result, s);
    if (err == cudaSuccess) err = cudaMemcpyAsync(host, result, 8, cudaMemcpyDeviceToHost, s);
    if (err == cudaSuccess) err = cudaStreamSynchronize(s);
    if (err != cudaSuccess) {
      out = std::string("CUDA error: ") + cudaGetErrorString(err);
    } else if (host[0] != 0) {
      float worst;
      std::memcpy(&worst, &host[1], 4);
      char msg[160];
      std::snprintf(msg, sizeof msg, "%u of %lld outputs outside tolerance (worst |d - ref| = %.3g x tolerance)%s",
                    host[0], static_cast<long long>(mn), worst, corrupt ? " [BLOCKFP8_SELF_CHECK_CORRUPT]" : "");
      out = msg;
    }
  }
  cudaFree(buf);
  return out;
}

}  // namespace

bool row_usable(const Problem& p, int row, int device_cc, cudaStream_t s) {
  const int t = slot(p.arch);
  if (t < 0 || row < 0 || row >= kMaxRows || !needs_check(p.arch, device_cc)) return true;
  RowState& r = g_rows[t][row];
  const int st = r.state.load();
  if (st != kUnchecked) return st == kPassed;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone) return false;
  std::lock_guard<std::mutex> lock(g_mu);
  if (r.state.load() != kUnchecked) return r.state.load() == kPassed;
  const std::string why = run_check(p.arch, row, p.sm_count, s);
  std::snprintf(r.detail, sizeof r.detail, "%s", why.c_str());
  if (!why.empty()) {
    std::fprintf(stderr,
                 "[blockfp8] WARNING: W8A8 GEMM row %s failed its first-use self-check against the reference: %s. "
                 "The row is disabled for this process (the GEMM op runs the reference kernel, the linear op "
                 "dequantizes + cuBLAS).\n",
                 gemm::row(p.arch, row).name, why.c_str());
  }
  r.state.store(why.empty() ? kPassed : kFailed);
  return why.empty();
}

std::string self_check_json(int arch) {
  const int t = slot(arch);
  std::string out = "[";
  for (int i = 0; t >= 0 && i < num_rows(arch) && i < kMaxRows; ++i) {
    const int st = g_rows[t][i].state.load();
    std::string detail;
    for (const char* c = g_rows[t][i].detail; *c; ++c) {
      if (*c == '"' || *c == '\\') detail.push_back('\\');
      detail.push_back(*c);
    }
    if (i) out += ", ";
    out += std::string("{\"name\": \"") + row(arch, i).name + "\", \"state\": \"" +
           (st == kPassed ? "passed" : st == kFailed ? "failed" : "unchecked") + "\", \"detail\": \"" + detail + "\"}";
  }
  return out + "]";
}

}  // namespace blockfp8::gemm
