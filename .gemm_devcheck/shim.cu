// Temporary ctypes shim for checking the sm90 GEMM on the device (not part of the package).
#include <cstdint>
#include "../vllm_blockfp8/csrc/gemm/gemm.h"
using namespace blockfp8::gemm;
static Problem make(const void* a, const float* as, int64_t ld, const void* b, const float* bs, void* d,
                    int64_t m, int64_t n, int64_t k, int bf16, int sm, void* ws, size_t wss) {
  Problem p{};
  p.a = a; p.a_scale = as; p.a_scale_ld = ld; p.b = b; p.b_scale = bs; p.d = d;
  p.m = m; p.n = n; p.k = k; p.out_bf16 = bf16 != 0; p.sm_count = sm; p.workspace = ws; p.workspace_size = wss;
  return p;
}
extern "C" int bf8_num_rows() { return num_rows(); }
extern "C" const char* bf8_row_name(int i) { return row(i).name; }
extern "C" long long bf8_row_max_m(int i) { return row(i).max_m; }
extern "C" const char* bf8_rejects(int i, const void* a, const float* as, int64_t ld, const void* b, const float* bs,
                                   void* d, int64_t m, int64_t n, int64_t k, int bf16, int sm) {
  return rejects(i, make(a, as, ld, b, bs, d, m, n, k, bf16, sm, nullptr, 0));
}
extern "C" int bf8_select(int64_t m, int64_t n, int64_t k, int sm) {
  return select(make(nullptr, nullptr, (m + 3) / 4 * 4, nullptr, nullptr, nullptr, m, n, k, 1, sm, nullptr, 0));
}
extern "C" size_t bf8_ws(int i, int64_t m, int64_t n, int64_t k, int bf16, int sm) {
  return workspace_bytes(i, make(nullptr, nullptr, (m + 3) / 4 * 4, nullptr, nullptr, nullptr, m, n, k, bf16, sm, nullptr, 0));
}
extern "C" int bf8_launch(int i, const void* a, const float* as, int64_t ld, const void* b, const float* bs, void* d,
                          int64_t m, int64_t n, int64_t k, int bf16, int sm, void* ws, size_t wss, void* stream) {
  return (int)launch(i, make(a, as, ld, b, bs, d, m, n, k, bf16, sm, ws, wss), (cudaStream_t)stream);
}
