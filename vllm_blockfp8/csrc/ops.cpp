// CUDA implementations of the blockfp8 tensor ops (schemas declared once, in vllm_blockfp8/ops.py), on the PyTorch
// stable ABI so one build serves every torch from 2.11 on. Tensor glue only: tensors become each family's plain
// Problem struct, the family picks its row (inside the op, never in traced Python; one path for every family,
// pick_row), and the kernel launches on the current stream. The host-query ops are in host_queries.cpp.
// Python validates inputs with ValueErrors first; the checks here only keep a direct call from crashing the process.
#include <cuda_runtime.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>

#include "common/device.h"
#include "common/overrides.h"
#include "common/tile_row.h"
#include "common/vector_rows.h"
#include "fp4/fp4.h"
#include "fp4/native.h"
#include "fp4/native_reference.h"
#include "gemm/first_use.h"
#include "gemm/gemm.h"
#include "gemm/reference.h"
#include "gemv/gemv.h"
#include "linear/linear.h"
#include "quant/quant.h"

namespace blockfp8 {
namespace {

using torch::stable::Tensor;
using ScalarType = torch::headeronly::ScalarType;

constexpr int64_t kGroup = 128;

void check_cuda(cudaError_t err, const char* what) {
  STD_TORCH_CHECK(err == cudaSuccess, "blockfp8: ", what, " failed: ", cudaGetErrorString(err));
}

cudaStream_t current_stream(const Tensor& t) {
  void* stream = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(t.get_device_index(), &stream));
  return static_cast<cudaStream_t>(stream);
}

DeviceFacts device_facts(int device) {
  DeviceFacts f;
  check_cuda(query_device(device, &f), "device query");
  return f;
}

// BLOCKFP8_LOG_ROWS=1 prints the chosen row once per (family, row, N, K).
void log_row(const char* family, const char* name, int64_t m, int64_t n, int64_t k) {
  static const bool enabled = [] {
    const char* v = std::getenv("BLOCKFP8_LOG_ROWS");
    return v != nullptr && v[0] != '\0' && v[0] != '0';
  }();
  if (!enabled) return;
  static std::mutex mu;
  static std::set<std::string> seen;
  std::string key = std::string(family) + "/" + name + "/" + std::to_string(n) + "x" + std::to_string(k);
  std::lock_guard<std::mutex> lock(mu);
  if (seen.insert(key).second)
    std::fprintf(stderr, "[blockfp8] %s N=%lld K=%lld M=%lld -> %s\n", family, (long long)n, (long long)k,
                 (long long)m, name);
}

bool is_16bit(ScalarType t) { return t == ScalarType::BFloat16 || t == ScalarType::Half; }

void check_weight(const Tensor& b, const Tensor& b_scale, int64_t k) {
  STD_TORCH_CHECK(b.scalar_type() == ScalarType::Float8_e4m3fn && b.dim() == 2 && b.is_contiguous(),
                  "blockfp8: b must be contiguous float8_e4m3fn [N, K]");
  STD_TORCH_CHECK(b.size(1) == k, "blockfp8: b has K=", b.size(1), ", activations have K=", k);
  STD_TORCH_CHECK(b_scale.scalar_type() == ScalarType::Float && b_scale.is_contiguous() && b_scale.dim() == 2 &&
                      b_scale.size(0) == (b.size(0) + kGroup - 1) / kGroup &&
                      b_scale.size(1) == (k + kGroup - 1) / kGroup,
                  "blockfp8: b_scale must be contiguous fp32 [ceil(N/128), ceil(K/128)]");
}

// ------------------------------------------------------------------------------------------
// Row picking: one path for every family
// ------------------------------------------------------------------------------------------

// Each family answers: its rows (the linear table's depend on the arch the shape names), whether row i can run a
// problem, its own choice (a row index, or for the GEMM the whole plan), and the choice of a forced row.
struct QuantFamily {
  using Problem = quant::TokenGroupProblem;
  using Choice = int;
  static constexpr const char* kName = "quant";
  static int num_rows(const Problem&) { return quant::num_rows(); }
  static const TileRow& row(int i, const Problem&) { return quant::row(i); }
  static const char* rejects(int i, const Problem& p) { return quant::rejects(i, p); }
  static Choice choose(const Problem& p) { return quant::select(p); }
  static Choice forced(int i, const Problem&) { return i; }
  static int index(Choice c) { return c; }
  static int64_t n(const Problem&) { return 0; }
};

struct GemvFamily {
  using Problem = gemv::Problem;
  using Choice = int;
  static constexpr const char* kName = "gemv";
  static int num_rows(const Problem&) { return gemv::num_rows(); }
  static const TileRow& row(int i, const Problem&) { return gemv::row(i); }
  static const char* rejects(int i, const Problem& p) { return gemv::rejects(i, p); }
  static Choice choose(const Problem& p) { return gemv::select(p); }
  static Choice forced(int i, const Problem&) { return i; }
  static int index(Choice c) { return c; }
  static int64_t n(const Problem& p) { return p.n; }
};

struct Fp4Family {
  using Problem = fp4::Problem;
  using Choice = int;
  static constexpr const char* kName = "nvfp4";
  static int num_rows(const Problem&) { return fp4::num_rows(); }
  static const TileRow& row(int i, const Problem&) { return fp4::row(i); }
  static const char* rejects(int i, const Problem& p) { return fp4::rejects(i, p); }
  static Choice choose(const Problem& p) { return fp4::select(p); }
  static Choice forced(int i, const Problem&) { return i; }
  static int index(Choice c) { return c; }
  static int64_t n(const Problem& p) { return p.n; }
};

// The GEMM's choice is its whole plan (row, K split, tile order, launch mode), computed once per call by the planner
// of the arch table the problem names (gemm.cpp routes).
struct GemmFamily {
  using Problem = gemm::Problem;
  using Choice = gemm::Plan;
  static constexpr const char* kName = "gemm";
  static int num_rows(const Problem& p) { return gemm::num_rows(p.arch); }
  static const TileRow& row(int i, const Problem& p) { return gemm::row(p.arch, i); }
  static const char* rejects(int, const Problem& p) { return gemm::rejects(p); }
  static Choice choose(const Problem& p) { return gemm::plan(p); }
  static Choice forced(int i, const Problem& p) { return gemm::plan(p, i); }
  static int index(const Choice& c) { return c.row; }
  static int64_t n(const Problem& p) { return p.n; }
};

struct LinearFamily {
  using Problem = linear::Shape;
  using Choice = int;
  static constexpr const char* kName = "linear";
  static int num_rows(const Problem& s) { return linear::num_rows(s.cc); }
  static const TileRow& row(int i, const Problem& s) { return linear::row(s.cc, i); }
  static const char* rejects(int i, const Problem& s) { return linear::rejects(s.cc, i, s); }
  static Choice choose(const Problem& s) { return linear::select(s); }
  static Choice forced(int i, const Problem&) { return i; }
  static int index(Choice c) { return c; }
  static int64_t n(const Problem& s) { return s.n; }
};

// The index of the row named `name` where it can run p, else -1 with one stderr line per (source, family, row): a row
// the environment or a tuned file names must never stop a call the family itself can serve.
template <typename F>
int usable_row(const char* name, const char* source, const typename F::Problem& p) {
  for (int i = 0; i < F::num_rows(p); ++i) {
    if (std::strcmp(F::row(i, p).name, name) != 0) continue;
    const char* why = F::rejects(i, p);
    if (why == nullptr && F::index(F::forced(i, p)) >= 0) return i;
    overrides::note_once(std::string(source) + "/" + F::kName + "/" + name,
                         std::string(source) + ": " + F::kName + " row " + name + " cannot run M=" +
                             std::to_string(p.m) + " N=" + std::to_string(F::n(p)) + " K=" + std::to_string(p.k) +
                             " (" + (why ? why : "no plan") + "); the table's own choice serves it" +
                             " (logged once per row)");
    return -1;
  }
  overrides::note_once(std::string(source) + "/" + F::kName + "/" + name,
                       std::string(source) + ": no " + F::kName + " row named " + name +
                           " in this GPU's table; the table's own choice serves every call");
  return -1;
}

// The row chosen from outside the table for a call that requests none: BLOCKFP8_FORCE's row for the family, else
// the tuned entry for (N, K, M); -1 for the family's own choice. Host work only, so a captured graph keeps one node.
template <typename F>
int outside_row(const typename F::Problem& p) {
  if (const char* name = overrides::forced(F::kName)) return usable_row<F>(name, "BLOCKFP8_FORCE", p);
  const auto table = overrides::tuned();
  if (!table) return -1;
  const char* name = overrides::tuned_row(*table, F::kName, p.m, F::n(p), p.k);
  return name == nullptr ? -1 : usable_row<F>(name, "tuned config", p);
}

// The family's choice (requested < 0; BLOCKFP8_FORCE or a tuned entry first), or the forced row `requested` where it
// can run p; logged by name.
template <typename F>
typename F::Choice pick_row(int requested, const typename F::Problem& p) {
  typename F::Choice c;
  if (requested < 0) {
    const int outside = outside_row<F>(p);
    c = outside >= 0 ? F::forced(outside, p) : F::choose(p);
    STD_TORCH_CHECK(F::index(c) >= 0, "blockfp8: no ", F::kName, " row takes M=", p.m, " N=", F::n(p), " K=", p.k);
  } else {
    STD_TORCH_CHECK(requested < F::num_rows(p), "blockfp8: ", F::kName, " row ", requested, " out of range");
    const char* why = F::rejects(requested, p);
    STD_TORCH_CHECK(why == nullptr, "blockfp8: forced ", F::kName, " row ", F::row(requested, p).name,
                    " cannot run M=", p.m, " N=", F::n(p), " K=", p.k, ": ", why);
    c = F::forced(requested, p);
  }
  log_row(F::kName, F::row(F::index(c), p).name, p.m, F::n(p), p.k);
  return c;
}

// ------------------------------------------------------------------------------------------
// Kernels on tensors (outputs allocated here; every size depends on shapes, never on data)
// ------------------------------------------------------------------------------------------

// Every quant row reads x rows as 16-byte vectors: a view whose rows are not 16-byte aligned is
// copied into a fresh (aligned) buffer first, so any x with a contiguous K is accepted.
std::tuple<Tensor, Tensor> quantize(const Tensor& x_in, int64_t row) {
  const int64_t m = x_in.size(0), k = x_in.size(1);
  Tensor x = x_in;
  if (x_in.numel() != 0 && !rows_16byte_aligned(x_in.data_ptr(), m, x_in.stride(0))) {
    x = torch::stable::new_empty(x_in, {m, k});
    torch::stable::copy_(x, x_in);
  }
  const int64_t m4 = (m + 3) / 4 * 4;
  Tensor q = torch::stable::new_empty(x, {m, k}, ScalarType::Float8_e4m3fn);
  Tensor s_buf = torch::stable::new_empty(x, {k / kGroup, m4}, ScalarType::Float);
  quant::TokenGroupProblem p;
  p.x = x.data_ptr();
  p.q = static_cast<uint8_t*>(q.data_ptr());
  p.s = static_cast<float*>(s_buf.data_ptr());
  p.m = m, p.k = k, p.x_stride = x.stride(0), p.s_ld = m4;
  p.bf16 = x.scalar_type() == ScalarType::BFloat16;
  p.trigger_dependents = gemm::quant_triggers(k);  // the SM90 launch mode: the GEMM after it may launch early
  const int i = pick_row<QuantFamily>(int(row), p);
  check_cuda(quant::launch(i, p, current_stream(x)), quant::row(i).name);
  Tensor s = torch::stable::transpose(torch::stable::narrow(s_buf, 1, 0, m), 0, 1);
  return {q, s};
}

Tensor run_gemv(const Tensor& x, const Tensor& b, const Tensor& b_scale, int64_t row, const DeviceFacts& dev) {
  const int64_t m = x.size(0), n = b.size(0), k = x.size(1);
  Tensor out = torch::stable::new_empty(x, {m, n});
  gemv::Problem p{};
  p.x = x.data_ptr();
  p.b = static_cast<const uint8_t*>(b.data_ptr());
  p.b_scale = static_cast<const float*>(b_scale.data_ptr());
  p.out = out.data_ptr();
  p.m = m, p.n = n, p.k = k, p.x_stride = x.stride(0), p.out_stride = n;
  p.bf16 = x.scalar_type() == ScalarType::BFloat16;
  p.sm_count = dev.sm_count;
  const int i = pick_row<GemvFamily>(int(row), p);
  if (m > 0) check_cuda(gemv::launch(i, p, current_stream(x)), gemv::row(i).name);
  return out;
}

Tensor run_gemm(const Tensor& a, const Tensor& a_scale, const Tensor& b, const Tensor& b_scale, ScalarType out_dtype,
                int64_t row, const DeviceFacts& dev) {
  const int64_t m = a.size(0), n = b.size(0), k = a.size(1);
  const int arch = gemm::table_arch(dev.cc);
  STD_TORCH_CHECK(!gemm::off(), "blockfp8: the W8A8 GEMM is off in this process (BLOCKFP8_GEMM_TABLE=none)");
  STD_TORCH_CHECK(arch != 0, "blockfp8: this build has no W8A8 GEMM for this GPU (SM", dev.cc, ")");
  STD_TORCH_CHECK(a_scale.stride(0) == 1 && (m <= 1 || a_scale.stride(1) >= m) && a_scale.stride(1) % 4 == 0,
                  "blockfp8: a_scale must be M-major with a leading dimension that is a multiple of 4");
  Tensor out = torch::stable::new_empty(a, {m, n}, out_dtype);
  gemm::Problem p{};
  p.a = a.data_ptr();
  p.a_scale = static_cast<const float*>(a_scale.data_ptr());
  p.a_scale_ld = a_scale.stride(1);
  p.b = b.data_ptr();
  p.b_scale = static_cast<const float*>(b_scale.data_ptr());
  p.d = out.data_ptr();
  p.m = m, p.n = n, p.k = k;
  p.out_bf16 = out_dtype == ScalarType::BFloat16;
  p.sm_count = dev.sm_count;
  p.arch = arch;
  const gemm::Plan plan = pick_row<GemmFamily>(int(row), p);
  // A row that failed its first-use self-check (or is unchecked inside a graph capture) yields to the reference.
  if (m > 0 && !gemm::row_usable(p, plan.row, dev.cc, current_stream(a))) {
    check_cuda(gemm::launch_reference(p, nullptr, nullptr, current_stream(a)), "reference GEMM");
    return out;
  }
  std::optional<Tensor> workspace;
  const size_t ws = gemm::workspace_bytes(p, plan);
  if (ws > 0) {
    workspace = torch::stable::new_empty(a, {int64_t(ws)}, ScalarType::Byte);
    p.workspace = workspace->data_ptr();
    p.workspace_size = ws;
  }
  if (m > 0) check_cuda(gemm::launch(p, plan, current_stream(a)), gemm::row(arch, plan.row).name);
  return out;
}

Tensor dequant_matmul(const Tensor& x, const Tensor& b, const Tensor& b_scale) {
  const int64_t n = b.size(0), k = b.size(1);
  Tensor w = torch::stable::new_empty(x, {n, k});
  quant::DequantProblem p{static_cast<const uint8_t*>(b.data_ptr()), static_cast<const float*>(b_scale.data_ptr()),
                          w.data_ptr(), n, k, x.scalar_type() == ScalarType::BFloat16};
  check_cuda(quant::launch_dequant_weight(p, current_stream(x)), "dequantize weight");
  return torch::stable::matmul(x, torch::stable::transpose(w, 0, 1));
}

void add_bias(Tensor& out, const Tensor& bias) {
  quant::BiasProblem p{out.data_ptr(), bias.data_ptr(), out.size(0), out.size(1),
                       out.scalar_type() == ScalarType::BFloat16};
  check_cuda(quant::launch_add_bias(p, current_stream(out)), "bias add");
}

// Native NVFP4 (fp4/native.h): x -> packed e2m1 + swizzled e4m3 scales, and the SM120 GEMM on them.
std::tuple<Tensor, Tensor> nvfp4_quantize(const Tensor& x_in, const Tensor& input_scale) {
  const int64_t m = x_in.size(0), k = x_in.size(1);
  Tensor x = x_in;
  if (x_in.numel() != 0 && !rows_16byte_aligned(x_in.data_ptr(), m, x_in.stride(0))) {
    x = torch::stable::new_empty(x_in, {m, k});  // the kernel reads rows as 16-byte vectors
    torch::stable::copy_(x, x_in);
  }
  Tensor q = torch::stable::new_empty(x, {m, k / 2}, ScalarType::Byte);
  Tensor sf = torch::stable::new_empty(x, {fp4::native::sf_rows(m), fp4::native::sf_cols(k)}, ScalarType::Float8_e4m3fn);
  fp4::native::QuantProblem p;
  p.x = x.data_ptr();
  p.input_scale = static_cast<const float*>(input_scale.data_ptr());
  p.q = static_cast<uint8_t*>(q.data_ptr());
  p.sf = static_cast<uint8_t*>(sf.data_ptr());
  p.m = m, p.k = k, p.x_stride = m > 0 ? x.stride(0) : k;
  p.bf16 = x.scalar_type() == ScalarType::BFloat16;
  check_cuda(fp4::native::launch_quantize(p, current_stream(x)), "nvfp4 activation quant");
  return {q, sf};
}

// The native GEMM on quantized operands; a row that failed its first-use self-check (or is unchecked inside a graph
// capture) yields to the reference kernel here, as the W8A8 GEMM op does (nvfp4_linear asks first and goes W4A16).
Tensor run_nvfp4_gemm(const Tensor& a, const Tensor& a_sf, const Tensor& b, const Tensor& b_sf, const Tensor& alpha,
                      ScalarType out_dtype, int i, int cc) {
  const int64_t m = a.size(0), n = b.size(0), k = a.size(1) * 2;
  Tensor out = torch::stable::new_empty(a, {m, n}, out_dtype);
  fp4::native::GemmProblem p;
  p.a = static_cast<const uint8_t*>(a.data_ptr());
  p.a_sf = static_cast<const uint8_t*>(a_sf.data_ptr());
  p.b = static_cast<const uint8_t*>(b.data_ptr());
  p.b_sf = static_cast<const uint8_t*>(b_sf.data_ptr());
  p.alpha = static_cast<const float*>(alpha.data_ptr());
  p.d = out.data_ptr();
  p.m = m, p.n = n, p.k = k;
  p.bf16 = out_dtype == ScalarType::BFloat16;
  if (i < 0) i = fp4::native::select(p);
  STD_TORCH_CHECK(i >= 0 && i < fp4::native::num_rows(), "blockfp8: no native NVFP4 row takes M=", m, " N=", n,
                  " K=", k);
  const char* why = fp4::native::rejects(i, p);
  STD_TORCH_CHECK(why == nullptr, "blockfp8: native NVFP4 row ", fp4::native::row(i).name, ": ", why);
  log_row("nvfp4_native", fp4::native::row(i).name, m, n, k);
  if (m > 0 && !fp4::native::native_row_usable(i, cc, current_stream(a))) {
    check_cuda(fp4::native::launch_reference(p, nullptr, nullptr, current_stream(a)), "reference NVFP4 GEMM");
    return out;
  }
  std::optional<Tensor> workspace;
  if (const size_t ws = fp4::native::workspace_bytes(i, p); ws > 0) {
    workspace = torch::stable::new_empty(a, {int64_t(ws)}, ScalarType::Byte);
    p.workspace = workspace->data_ptr();
  }
  if (m > 0) check_cuda(fp4::native::launch(i, p, current_stream(a)), fp4::native::row(i).name);
  return out;
}

// ------------------------------------------------------------------------------------------
// Op implementations
// ------------------------------------------------------------------------------------------

std::tuple<Tensor, Tensor> op_per_token_group_quant(Tensor x, int64_t group_size, int64_t row) {
  STD_TORCH_CHECK(group_size == kGroup, "blockfp8: group_size must be 128");
  STD_TORCH_CHECK(is_16bit(x.scalar_type()) && x.dim() == 2 && x.stride(1) == 1 && x.size(1) % kGroup == 0,
                  "blockfp8: x must be bf16/fp16 [M, K] with contiguous K and K % 128 == 0");
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  return quantize(x, row);
}

Tensor op_gemv(Tensor x, Tensor b, Tensor b_scale, int64_t row) {
  STD_TORCH_CHECK(is_16bit(x.scalar_type()) && x.dim() == 2 && x.stride(1) == 1,
                  "blockfp8: x must be bf16/fp16 [M, K] with contiguous K");
  check_weight(b, b_scale, x.size(1));
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  return run_gemv(x, b, b_scale, row, device_facts(x.get_device_index()));
}

Tensor op_gemm(Tensor a, Tensor a_scale, Tensor b, Tensor b_scale, ScalarType out_dtype, int64_t row) {
  STD_TORCH_CHECK(a.scalar_type() == ScalarType::Float8_e4m3fn && a.dim() == 2 && a.stride(1) == 1,
                  "blockfp8: a must be float8_e4m3fn [M, K] with contiguous K");
  STD_TORCH_CHECK(is_16bit(out_dtype), "blockfp8: out_dtype must be bf16 or fp16");
  check_weight(b, b_scale, a.size(1));
  torch::stable::accelerator::DeviceGuard guard(a.get_device_index());
  return run_gemm(a, a_scale, b, b_scale, out_dtype, row, device_facts(a.get_device_index()));
}

// The linear row picks the path; the path's family then picks its kernel row once (the W8A8 GEMM: its whole plan).
Tensor op_linear(Tensor x, Tensor b, Tensor b_scale, std::optional<Tensor> bias, int64_t row) {
  STD_TORCH_CHECK(is_16bit(x.scalar_type()) && x.dim() == 2 && x.stride(1) == 1,
                  "blockfp8: x must be bf16/fp16 [M, K] with contiguous K");
  check_weight(b, b_scale, x.size(1));
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  const DeviceFacts dev = device_facts(x.get_device_index());
  const linear::Shape shape{x.size(0), b.size(0), x.size(1), linear::table_arch(dev.cc), dev.sm_count};
  const int i = pick_row<LinearFamily>(int(row), shape);
  Tensor out = x;
  switch (linear::path(shape.cc, i)) {
    case linear::Path::kGemv:
      out = run_gemv(x, b, b_scale, -1, dev);
      break;
    case linear::Path::kW8A8: {
      // The GEMM row this call would run, where it failed its first-use self-check (or is unchecked inside a graph
      // capture): the dequantize + cuBLAS path instead.
      const gemm::Problem planned = linear::gemm_shape(shape);
      const gemm::Plan gemm_plan = gemm::plan(planned);
      if (x.size(0) > 0 && gemm_plan.row >= 0 &&
          !gemm::row_usable(planned, gemm_plan.row, dev.cc, current_stream(x))) {
        out = dequant_matmul(x, b, b_scale);
        break;
      }
      // A strided x is made contiguous first, as the H200-tested path did; the quantizer could
      // read it in place (the op does), which the next GPU run can measure and then adopt here.
      Tensor xc = x.is_contiguous() ? x : torch::stable::contiguous(x);
      auto [q, s] = quantize(xc, -1);
      out = run_gemm(q, s, b, b_scale, x.scalar_type(), -1, dev);
      break;
    }
    case linear::Path::kDequantMatmul:
      out = dequant_matmul(x, b, b_scale);
      break;
  }
  if (bias.has_value()) add_bias(out, *bias);
  return out;
}

// NVFP4 linear: native W4A4 (quantize x + the SM120 GEMM) where fp4::native::path_rejects allows it and the layer
// gave the swizzled weight scales, input_scale and alpha; otherwise weight-only (csrc/fp4): the row by M, the K
// split's workspace when the row needs one. A forced row is always a weight-only row. packing: b's and b_scale's
// (fp4.h: 0 ModelOpt's, 1 paired, 2 fragment, whose b_scale is exp8 bytes); the native GEMM reads ModelOpt's only.
Tensor op_nvfp4_linear(Tensor x, Tensor b, Tensor b_scale, Tensor global_scale, std::optional<Tensor> bias,
                       int64_t row, std::optional<Tensor> b_scale_swizzled, std::optional<Tensor> input_scale,
                       std::optional<Tensor> alpha, int64_t packing) {
  STD_TORCH_CHECK(is_16bit(x.scalar_type()) && x.dim() == 2 && x.stride(1) == 1,
                  "blockfp8: x must be bf16/fp16 [M, K] with contiguous K");
  const int64_t m = x.size(0), k = x.size(1), n = b.size(0);
  STD_TORCH_CHECK(b.scalar_type() == ScalarType::Byte && b.dim() == 2 && b.is_contiguous() && b.size(1) * 2 == k,
                  "blockfp8: b must be contiguous uint8 [N, K/2]");
  STD_TORCH_CHECK(packing >= 0 && packing <= 2, "blockfp8: packing must be 0 (ModelOpt), 1 (paired) or 2 (fragment)");
  const auto packed = static_cast<fp4::Packing>(packing);
  const ScalarType scale_type = packed == fp4::Packing::kFragment ? ScalarType::Byte : ScalarType::Float8_e4m3fn;
  STD_TORCH_CHECK(b_scale.scalar_type() == scale_type && b_scale.is_contiguous() && b_scale.dim() == 2 &&
                      b_scale.size(0) == n && b_scale.size(1) * 16 == k,
                  "blockfp8: b_scale must be contiguous [N, K/16]: float8_e4m3fn, or uint8 exp8 (fragment packing)");
  STD_TORCH_CHECK(global_scale.scalar_type() == ScalarType::Float && global_scale.is_contiguous() &&
                      (global_scale.numel() == n || global_scale.numel() == 1),
                  "blockfp8: global_scale must be contiguous fp32 with N or 1 elements");
  if (bias.has_value())
    STD_TORCH_CHECK(bias->scalar_type() == x.scalar_type() && bias->is_contiguous() && bias->numel() == n,
                    "blockfp8: bias must be contiguous [N] in x's dtype");
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  const DeviceFacts dev = device_facts(x.get_device_index());
  STD_TORCH_CHECK(!(packed != fp4::Packing::kModelOpt && b_scale_swizzled.has_value()),
                  "blockfp8: the native NVFP4 operands need b in ModelOpt's packing");
  if (row < 0 && b_scale_swizzled.has_value() && input_scale.has_value() && alpha.has_value() &&
      fp4::native::path_rejects(dev.cc, m, n, k) == nullptr) {
    fp4::native::GemmProblem shape;
    shape.m = m, shape.n = n, shape.k = k;
    const int i = fp4::native::select(shape);
    // A row that failed its first-use self-check, or is unchecked inside a graph capture: the W4A16 path below.
    if (fp4::native::native_row_usable(i, dev.cc, current_stream(x))) {
      auto [q, sf] = nvfp4_quantize(x, *input_scale);
      Tensor out = run_nvfp4_gemm(q, sf, b, *b_scale_swizzled, *alpha, x.scalar_type(), i, dev.cc);
      if (bias.has_value()) add_bias(out, *bias);
      return out;
    }
  }
  fp4::Problem p{};
  p.x = x.data_ptr();
  p.b = static_cast<const uint8_t*>(b.data_ptr());
  p.b_scale = static_cast<const uint8_t*>(b_scale.data_ptr());
  p.global_scale = static_cast<const float*>(global_scale.data_ptr());
  p.global_scale_stride = global_scale.numel() == n && n != 1 ? 1 : 0;
  p.bias = bias.has_value() ? bias->data_ptr() : nullptr;
  p.m = m, p.n = n, p.k = k, p.x_stride = x.stride(0), p.out_stride = n;
  p.bf16 = x.scalar_type() == ScalarType::BFloat16;
  p.packing = packed;
  p.sm_count = dev.sm_count;
  p.max_smem = dev.max_smem;
  p.cc = dev.cc;
  const int i = pick_row<Fp4Family>(int(row), p);  // before out exists: the dequantize row never allocates one
  if (fp4::dequantizes(i)) {
    if (m == 0) return torch::stable::new_empty(x, {0, n});
    Tensor w = torch::stable::new_empty(x, {n, k});  // the weight in x's type, global scale folded in
    p.workspace = w.data_ptr();
    check_cuda(fp4::launch(i, p, current_stream(x)), fp4::row(i).name);
    Tensor out = torch::stable::matmul(x, torch::stable::transpose(w, 0, 1));
    if (bias.has_value()) add_bias(out, *bias);
    return out;
  }
  Tensor out = torch::stable::new_empty(x, {m, n});
  p.out = out.data_ptr();
  std::optional<Tensor> workspace;  // a K split's fp32 partials
  if (const size_t ws = fp4::workspace_bytes(i, p); ws > 0) {
    workspace = torch::stable::new_empty(x, {int64_t(ws)}, ScalarType::Byte);
    p.workspace = workspace->data_ptr();
  }
  if (m > 0) check_cuda(fp4::launch(i, p, current_stream(x)), fp4::row(i).name);
  return out;
}

std::tuple<Tensor, Tensor> op_nvfp4_quant(Tensor x, Tensor input_scale) {
  STD_TORCH_CHECK(is_16bit(x.scalar_type()) && x.dim() == 2 && x.stride(1) == 1 && x.size(1) % 32 == 0,
                  "blockfp8: x must be bf16/fp16 [M, K] with contiguous K and K % 32 == 0");
  STD_TORCH_CHECK(input_scale.scalar_type() == ScalarType::Float && input_scale.numel() == 1,
                  "blockfp8: input_scale must be one fp32 value");
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  return nvfp4_quantize(x, input_scale);
}

Tensor op_nvfp4_swizzle_scale(Tensor scale) {
  STD_TORCH_CHECK(scale.scalar_type() == ScalarType::Float8_e4m3fn && scale.dim() == 2 && scale.is_contiguous(),
                  "blockfp8: scale must be contiguous float8_e4m3fn [rows, K/16]");
  torch::stable::accelerator::DeviceGuard guard(scale.get_device_index());
  const int64_t rows = scale.size(0), k = scale.size(1) * 16;
  Tensor out = torch::stable::new_empty(scale, {fp4::native::sf_rows(rows), fp4::native::sf_cols(k)});
  fp4::native::SwizzleProblem p{static_cast<const uint8_t*>(scale.data_ptr()), static_cast<uint8_t*>(out.data_ptr()),
                                rows, k};
  check_cuda(fp4::native::launch_swizzle(p, current_stream(scale)), "nvfp4 scale swizzle");
  return out;
}

Tensor op_nvfp4_gemm(Tensor a, Tensor a_scale, Tensor b, Tensor b_scale, Tensor alpha, ScalarType out_dtype,
                     int64_t row) {
  STD_TORCH_CHECK(a.scalar_type() == ScalarType::Byte && b.scalar_type() == ScalarType::Byte && a.dim() == 2 &&
                      b.dim() == 2 && a.is_contiguous() && b.is_contiguous() && a.size(1) == b.size(1),
                  "blockfp8: a and b must be contiguous uint8 [M, K/2] and [N, K/2]");
  STD_TORCH_CHECK(is_16bit(out_dtype), "blockfp8: out_dtype must be bf16 or fp16");
  const int64_t k = a.size(1) * 2;
  STD_TORCH_CHECK(a_scale.numel() == fp4::native::sf_rows(a.size(0)) * fp4::native::sf_cols(k) &&
                      b_scale.numel() == fp4::native::sf_rows(b.size(0)) * fp4::native::sf_cols(k),
                  "blockfp8: a_scale and b_scale must be swizzled (nvfp4_quant, nvfp4_swizzle_scale)");
  STD_TORCH_CHECK(alpha.scalar_type() == ScalarType::Float && alpha.numel() == 1, "blockfp8: alpha must be one fp32");
  torch::stable::accelerator::DeviceGuard guard(a.get_device_index());
  return run_nvfp4_gemm(a, a_scale, b, b_scale, alpha, out_dtype, int(row), device_facts(a.get_device_index()).cc);
}

// The arch-neutral reference of the native GEMM (fp4/native_reference.h) on the same operands as nvfp4_gemm (k % 16
// only: no alignment or tile preconditions): its fp32 result and the magnitudes of the self-check's tolerance, so any
// GPU can test the yardstick against reference.py.
std::tuple<Tensor, Tensor> op_nvfp4_gemm_reference(Tensor a, Tensor a_scale, Tensor b, Tensor b_scale, Tensor alpha) {
  STD_TORCH_CHECK(a.scalar_type() == ScalarType::Byte && b.scalar_type() == ScalarType::Byte && a.dim() == 2 &&
                      b.dim() == 2 && a.is_contiguous() && b.is_contiguous() && a.size(1) == b.size(1) &&
                      a.size(1) > 0 && a.size(1) % 8 == 0,
                  "blockfp8: a and b must be contiguous uint8 [M, K/2] and [N, K/2] with K > 0, K % 16 == 0");
  const int64_t m = a.size(0), n = b.size(0), k = a.size(1) * 2;
  STD_TORCH_CHECK(a_scale.scalar_type() == ScalarType::Float8_e4m3fn &&
                      b_scale.scalar_type() == ScalarType::Float8_e4m3fn && a_scale.is_contiguous() &&
                      b_scale.is_contiguous() && a_scale.numel() == fp4::native::sf_rows(m) * fp4::native::sf_cols(k) &&
                      b_scale.numel() == fp4::native::sf_rows(n) * fp4::native::sf_cols(k),
                  "blockfp8: a_scale and b_scale must be swizzled (nvfp4_quant, nvfp4_swizzle_scale)");
  STD_TORCH_CHECK(alpha.scalar_type() == ScalarType::Float && alpha.numel() == 1, "blockfp8: alpha must be one fp32");
  torch::stable::accelerator::DeviceGuard guard(a.get_device_index());
  Tensor ref = torch::stable::new_empty(a, {m, n}, ScalarType::Float);
  Tensor mag = torch::stable::new_empty(a, {m, n}, ScalarType::Float);
  fp4::native::GemmProblem p;
  p.a = static_cast<const uint8_t*>(a.data_ptr());
  p.a_sf = static_cast<const uint8_t*>(a_scale.data_ptr());
  p.b = static_cast<const uint8_t*>(b.data_ptr());
  p.b_sf = static_cast<const uint8_t*>(b_scale.data_ptr());
  p.alpha = static_cast<const float*>(alpha.data_ptr());
  p.m = m, p.n = n, p.k = k;
  check_cuda(fp4::native::launch_reference(p, static_cast<float*>(ref.data_ptr()), static_cast<float*>(mag.data_ptr()),
                                           current_stream(a)),
             "reference NVFP4 GEMM");
  return {ref, mag};
}

}  // namespace
}  // namespace blockfp8

STABLE_TORCH_LIBRARY_IMPL(blockfp8, CUDA, m) {
  m.impl("per_token_group_quant", TORCH_BOX(&blockfp8::op_per_token_group_quant));
  m.impl("gemv", TORCH_BOX(&blockfp8::op_gemv));
  m.impl("gemm", TORCH_BOX(&blockfp8::op_gemm));
  m.impl("linear", TORCH_BOX(&blockfp8::op_linear));
  m.impl("nvfp4_linear", TORCH_BOX(&blockfp8::op_nvfp4_linear));
  m.impl("nvfp4_quant", TORCH_BOX(&blockfp8::op_nvfp4_quant));
  m.impl("nvfp4_swizzle_scale", TORCH_BOX(&blockfp8::op_nvfp4_swizzle_scale));
  m.impl("nvfp4_gemm", TORCH_BOX(&blockfp8::op_nvfp4_gemm));
  m.impl("nvfp4_gemm_reference", TORCH_BOX(&blockfp8::op_nvfp4_gemm_reference));
}
