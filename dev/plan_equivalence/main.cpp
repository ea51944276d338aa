// Equivalence check of the SM90 GEMM planner (run.sh): REV's selection (ref.cpp, make_ref.py) against the
// worktree's (new.cpp) over a large grid, every switch combination and every forced row; exits 1 on a mismatch.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>
#include "result.h"
int ref_num_rows(); const char* ref_row_name(int); int64_t ref_row_max_m(int);
int new_num_rows(); const char* new_row_name(int); int64_t new_row_max_m(int);
static std::map<std::string, std::string> g_env;
const char* ref_getenv(const char* name) {
  auto it = g_env.find(name);
  return it == g_env.end() ? nullptr : it->second.c_str();
}
static long long g_points = 0, g_mismatch = 0;
static void check(int64_t m, int64_t n, int64_t k, int sms, int forced) {
  const Result a = ref_eval(m, n, k, sms, forced), b = new_eval(m, n, k, sms, forced);
  ++g_points;
  if (!(a == b)) {
    if (++g_mismatch <= 20) {
      std::string env;
      for (auto& kv : g_env) env += kv.first + "=" + kv.second + " ";
      std::printf("MISMATCH m=%lld n=%lld k=%lld sms=%d forced=%d env[%s]: ref row %d sk %d sp %d sl %d r %d sw %d tn %d pdl %d qt %d nd %d | new row %d sk %d sp %d sl %d r %d sw %d tn %d pdl %d qt %d nd %d\n",
                  (long long)m, (long long)n, (long long)k, sms, forced, env.c_str(), a.row, a.stream_k, a.splits, a.slices, a.raster, a.swizzle, a.tile_n, a.pdl, a.quant_triggers, a.nondet,
                  b.row, b.stream_k, b.splits, b.slices, b.raster, b.swizzle, b.tile_n, b.pdl, b.quant_triggers, b.nondet);
    }
  }
}
int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "quick") == 0;
  // The table itself: names, bounds, order.
  if (ref_num_rows() != new_num_rows()) { std::printf("row count differs\n"); return 1; }
  for (int i = 0; i < ref_num_rows(); ++i)
    if (std::strcmp(ref_row_name(i), new_row_name(i)) != 0 || ref_row_max_m(i) != new_row_max_m(i)) {
      std::printf("row %d differs: %s / %s\n", i, ref_row_name(i), new_row_name(i)); return 1; }
  std::vector<int64_t> shapes_n = {200, 256, 288, 384, 576, 768, 896, 960, 1024, 1152, 1536, 2048, 2112, 2304, 2560, 3072, 3584, 3840, 4096, 4608, 5120, 5376, 5632, 5760, 6144, 6912, 7168, 7680, 8192, 8704, 8960, 9216, 9472, 9728, 10240, 10944, 11008, 11264, 11520, 12288, 12800, 13696, 13824, 14336, 15360, 16384, 17920, 18432, 19456, 20480, 21888, 22016, 23040, 24576, 25600, 27392, 27648, 28672, 32768, 34816, 37888, 46080, 49152};
  std::vector<int64_t> shapes_k = {384, 512, 768, 896, 1024, 1152, 1536, 2048, 2304, 2560, 3072, 3584, 3840, 3884, 4096, 4864, 5120, 5632, 6144, 6912, 7168, 8192, 8448, 8704, 8960, 9216, 9728, 10240, 10944, 11008, 11264, 12288, 12800, 13696, 13824, 14336, 15360, 16384, 17408, 17920, 18432, 18944, 21504, 24576, 27648};
  std::vector<int64_t> ns = shapes_n, ks = shapes_k;
  for (int64_t n = 128; n <= 16384; n += 128) ns.push_back(n);
  for (int64_t n : {8, 16, 24, 40, 72, 104, 136, 200, 264, 328, 520, 600, 1000, 1032, 1544, 2056, 2120, 3000, 4104, 5000, 6152, 8200, 8456, 8840, 9000, 10248, 11000, 12296, 12680, 12688, 13000, 16392, 20000})
    ns.push_back(n);
  for (int64_t n : {100, 2110, 4100}) ns.push_back(n);  // n % 8 != 0: rejected
  for (int64_t k = 128; k <= 16384; k += 128) ks.push_back(k);
  for (int64_t k : {20480, 32768, 200, 3884}) ks.push_back(k);  // k % 128 != 0 too
  std::sort(ns.begin(), ns.end()); ns.erase(std::unique(ns.begin(), ns.end()), ns.end());
  std::sort(ks.begin(), ks.end()); ks.erase(std::unique(ks.begin(), ks.end()), ks.end());
  std::vector<int64_t> ms;
  for (int64_t m = 0; m <= 600; ++m) ms.push_back(m);
  for (int64_t m = 601; m <= 8192; m += (m < 2200 ? 3 : 17)) ms.push_back(m);
  for (int64_t m : {1023, 1024, 1025, 1151, 1152, 1153, 1408, 1664, 2047, 2048, 2049, 2176, 2944, 3200, 4095, 4096, 4097, 6000, 8191, 8192, 12000, 16384})
    ms.push_back(m);
  std::sort(ms.begin(), ms.end()); ms.erase(std::unique(ms.begin(), ms.end()), ms.end());
  const int sms_list[] = {78, 114, 132};
  std::mt19937_64 rng(41);
  // 1. Default switches over the full grid (quick: every 4th K), auto-selected rows.
  g_env.clear();
  for (int sms : sms_list)
    for (size_t ki = 0; ki < ks.size(); ki += quick ? 4 : 1)
      for (int64_t n : ns)
        for (int64_t m : ms) check(m, n, ks[ki], sms, -1);
  const long long p1 = g_points;
  std::printf("default switches: %lld points, %lld mismatches\n", p1, g_mismatch);
  // 2. Every combination of the switches the planner reads, on a sampled grid.
  std::vector<std::vector<std::pair<const char*, const char*>>> axes = {
      {{"BLOCKFP8_SM90_RASTER", ""}, {"BLOCKFP8_SM90_RASTER", "heuristic"}, {"BLOCKFP8_SM90_RASTER", "along_m"}, {"BLOCKFP8_SM90_RASTER", "along_n"}},
      {{"BLOCKFP8_SM90_SWIZZLE", ""}, {"BLOCKFP8_SM90_SWIZZLE", "1"}, {"BLOCKFP8_SM90_SWIZZLE", "2"}, {"BLOCKFP8_SM90_SWIZZLE", "4"}, {"BLOCKFP8_SM90_SWIZZLE", "8"}},
      {{"BLOCKFP8_SM90_SPLITS", ""}, {"BLOCKFP8_SM90_SPLITS", "1"}, {"BLOCKFP8_SM90_SPLITS", "2"}, {"BLOCKFP8_SM90_SPLITS", "3"}, {"BLOCKFP8_SM90_SPLITS", "4"}, {"BLOCKFP8_SM90_SPLITS", "6"}, {"BLOCKFP8_SM90_SPLITS", "8"}},
      {{"BLOCKFP8_SM90_REDUCTION", ""}, {"BLOCKFP8_SM90_REDUCTION", "deterministic"}, {"BLOCKFP8_SM90_REDUCTION", "nondeterministic"}},
      {{"BLOCKFP8_SM90_TILE_N", ""}, {"BLOCKFP8_SM90_TILE_N", "16"}, {"BLOCKFP8_SM90_TILE_N", "32"}, {"BLOCKFP8_SM90_TILE_N", "48"}, {"BLOCKFP8_SM90_TILE_N", "64"}, {"BLOCKFP8_SM90_TILE_N", "80"}, {"BLOCKFP8_SM90_TILE_N", "96"}, {"BLOCKFP8_SM90_TILE_N", "112"}, {"BLOCKFP8_SM90_TILE_N", "128"}, {"BLOCKFP8_SM90_TILE_N", "144"}, {"BLOCKFP8_SM90_TILE_N", "160"}, {"BLOCKFP8_SM90_TILE_N", "192"}},
      {{"BLOCKFP8_SM90_PDL", ""}, {"BLOCKFP8_SM90_PDL", "0"}, {"BLOCKFP8_SM90_PDL", "1"}, {"BLOCKFP8_SM90_PDL", "gemm"}}};
  std::vector<size_t> idx(axes.size(), 0);
  long long combos = 0;
  const int per_combo = quick ? 300 : 3000;
  while (true) {
    g_env.clear();
    for (size_t a = 0; a < axes.size(); ++a) g_env[axes[a][idx[a]].first] = axes[a][idx[a]].second;
    ++combos;
    for (int i = 0; i < per_combo; ++i) {
      const int64_t m = ms[rng() % ms.size()], n = ns[rng() % ns.size()], k = ks[rng() % ks.size()];
      check(m, n, k, sms_list[rng() % 3], -1);
    }
    size_t a = 0;
    while (a < axes.size() && ++idx[a] == axes[a].size()) idx[a++] = 0;
    if (a == axes.size()) break;
  }
  const long long p2 = g_points - p1;
  std::printf("switch combinations: %lld combos, %lld points\n", combos, p2);
  // 3. Forced rows (the K plan of every row at every problem it may be forced onto), default and sampled switches.
  g_env.clear();
  for (int forced = 0; forced < new_num_rows(); ++forced)
    for (int sms : sms_list)
      for (size_t ki = 0; ki < ks.size(); ki += quick ? 8 : 3)
        for (size_t ni = 0; ni < ns.size(); ni += 2)
          for (size_t mi = 0; mi < ms.size(); mi += 5) check(ms[mi], ns[ni], ks[ki], sms, forced);
  for (int i = 0; i < (quick ? 20000 : 400000); ++i) {
    g_env.clear();
    for (auto& axis : axes) { auto& v = axis[rng() % axis.size()]; g_env[v.first] = v.second; }
    check(ms[rng() % ms.size()], ns[rng() % ns.size()], ks[rng() % ks.size()], sms_list[rng() % 3], int(rng() % 14) - 1);
  }
  const long long p3 = g_points - p1 - p2;
  std::printf("forced rows: %lld points\n", p3);
  std::printf("TOTAL %lld points compared, %lld mismatches\n", g_points, g_mismatch);
  return g_mismatch == 0 ? 0 : 1;
}
