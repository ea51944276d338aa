// BLOCKFP8_FORCE and the tuned table (overrides.h). Host code only: no CUDA, no torch types.
#include "common/overrides.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

namespace blockfp8::overrides {
namespace {

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

// "family:ROW[,family:ROW...]". ops.py refuses a malformed value at import, so a piece that does not parse here
// can only come from loading the extension without the package: it is skipped.
std::map<std::string, std::string> parse_force(const char* value) {
  std::map<std::string, std::string> out;
  std::stringstream in(value == nullptr ? "" : value);
  std::string piece;
  while (std::getline(in, piece, ',')) {
    const size_t colon = piece.find(':');
    if (colon == std::string::npos) continue;
    const std::string family = trim(piece.substr(0, colon)), row = trim(piece.substr(colon + 1));
    if (!family.empty() && !row.empty()) out[family] = row;
  }
  return out;
}

// Read on first use, never changed afterwards: forced() hands out pointers into it.
const std::map<std::string, std::string>& force_map() {
  static const std::map<std::string, std::string> m = parse_force(std::getenv("BLOCKFP8_FORCE"));
  return m;
}

std::shared_ptr<const TunedTable> g_tuned;  // read and replaced through std::atomic_load / atomic_store

}  // namespace

const char* forced(const char* family) {
  const auto& m = force_map();
  if (m.empty()) return nullptr;
  const auto it = m.find(family);
  return it == m.end() ? nullptr : it->second.c_str();
}

std::shared_ptr<const TunedTable> tuned() { return std::atomic_load(&g_tuned); }

const char* tuned_row(const TunedTable& table, const char* family, int64_t m, int64_t n, int64_t k) {
  for (const TunedEntry& e : table)
    if (e.n == n && e.k == k && e.m_min <= m && m <= e.m_max && e.family == family) return e.row.c_str();
  return nullptr;
}

std::string set_tuned(const std::string& text) {
  auto table = std::make_shared<TunedTable>();
  std::stringstream in(text);
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (trim(line).empty()) continue;
    std::stringstream fields(line);
    TunedEntry e;
    std::string extra;
    if (!(fields >> e.family >> e.n >> e.k >> e.m_min >> e.m_max >> e.row) || (fields >> extra))
      return "line " + std::to_string(number) + ": expected 'family n k m_min m_max row', got '" + line + "'";
    if (e.n < 1 || e.k < 1 || e.m_min < 1 || e.m_max < e.m_min)
      return "line " + std::to_string(number) + ": needs n, k >= 1 and 1 <= m_min <= m_max";
    table->push_back(std::move(e));
  }
  std::shared_ptr<const TunedTable> next;
  if (!table->empty()) next = std::move(table);
  std::atomic_store(&g_tuned, next);
  return std::string();
}

std::string tuned_text() {
  const auto table = tuned();
  std::string out;
  if (!table) return out;
  for (const TunedEntry& e : *table)
    out += e.family + " " + std::to_string(e.n) + " " + std::to_string(e.k) + " " + std::to_string(e.m_min) + " " +
           std::to_string(e.m_max) + " " + e.row + "\n";
  return out;
}

void note_once(const std::string& key, const std::string& message) {
  static std::mutex mu;
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(mu);
  if (seen.insert(key).second) std::fprintf(stderr, "[blockfp8] %s\n", message.c_str());
}

}  // namespace blockfp8::overrides
