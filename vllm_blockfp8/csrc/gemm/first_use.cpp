// First-use self-check of the W8A8 GEMM rows (first_use.h has the rule and the switches): which rows need it, and
// the check itself (host logic plus cudaMalloc'd scratch). The per-row state, the warning and the capture rule are
// the shared registry's (common/first_use.h).
#include "first_use.h"

#include <cstdio>
#include <cstring>
#include <vector>

#include "../common/first_use.h"
#include "reference.h"

namespace blockfp8::gemm {
namespace {

constexpr const char* kFamily = "gemm";

bool known_table(int arch) { return arch == 89 || arch == 90 || arch == 120; }

// Tables that have never run on their own hardware here check themselves there; BLOCKFP8_SELF_CHECK=always: all.
bool needs_check(int arch, int device_cc) {
  return first_use::check_always() || (arch == device_cc && (arch == 89 || arch == 120));
}

// Runs row `row` of table `arch` once on a deterministic problem: M in the row's bucket (its largest M less 3, so
// the last token tile is ragged; 197 for the unbounded row), N = 264 (two full 128-wide weight tiles and a ragged
// 8-wide one), K = 512 (four scale blocks); compares to the reference. Returns "" on a match, else what went wrong.
// corrupt: the test switch names this row (its output is perturbed inside the comparison).
std::string run_check(int arch, int row, int sm_count, bool corrupt, cudaStream_t s) {
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

const first_use::Words kWords{"W8A8 GEMM",
                              "the GEMM op runs the reference kernel, the linear op dequantizes + cuBLAS"};

}  // namespace

bool row_usable(const Problem& p, int row, int device_cc, cudaStream_t s) {
  if (!known_table(p.arch) || row < 0 || row >= num_rows(p.arch) || !needs_check(p.arch, device_cc)) return true;
  return first_use::usable({kFamily, p.arch, row, gemm::row(p.arch, row).name}, kWords, s,
                           [&](bool corrupt) { return run_check(p.arch, row, p.sm_count, corrupt, s); });
}

std::vector<int> rows_to_check(int arch, int device_cc) {
  std::vector<int> out;
  if (!known_table(arch) || !needs_check(arch, device_cc)) return out;
  for (int i = 0; i < num_rows(arch); ++i)
    if (first_use::state({kFamily, arch, i, row(arch, i).name}) == first_use::State::kUnchecked) out.push_back(i);
  return out;
}

std::string check_row_now(int arch, int row_index, int sm_count, cudaStream_t s) {
  if (!known_table(arch) || row_index < 0 || row_index >= num_rows(arch)) return "no such row";
  return run_check(arch, row_index, sm_count, first_use::corrupt_for(row(arch, row_index).name), s);
}

void record_check(int arch, int row_index, const std::string& why) {
  if (!known_table(arch) || row_index < 0 || row_index >= num_rows(arch)) return;
  first_use::record({kFamily, arch, row_index, row(arch, row_index).name}, kWords, why);
}

std::string self_check_json(int arch) {
  return first_use::states_json(kFamily, arch, known_table(arch) ? num_rows(arch) : 0,
                                [arch](int i) { return row(arch, i).name; });
}

}  // namespace blockfp8::gemm
