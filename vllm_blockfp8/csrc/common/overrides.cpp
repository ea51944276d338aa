// BLOCKFP8_FORCE and the tuned table (overrides.h). Host code only: no CUDA, no torch types, and no iostreams: on the
// H200 image a std::stringstream used inside the serving process segfaulted (the tuned-table op crashed there while
// the same build passed on a CPU machine; std::ostringstream in an exception message crashed the same way), so text
// is split and numbers parsed by hand.
#include "common/overrides.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

namespace blockfp8::overrides {
namespace {

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r"), b = s.find_last_not_of(" \t\r");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

// The pieces of `s` between separators `sep` (empty pieces kept).
std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t end; (end = s.find(sep, start)) != std::string::npos; start = end + 1)
    out.push_back(s.substr(start, end - start));
  out.push_back(s.substr(start));
  return out;
}

// The whitespace-separated fields of a line.
std::vector<std::string> fields_of(const std::string& line) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
    const size_t start = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t' && line[i] != '\r') ++i;
    if (i > start) out.push_back(line.substr(start, i - start));
  }
  return out;
}

// A decimal integer in [0, 2^62) made of digits only, or -1.
int64_t parse_count(const std::string& f) {
  if (f.empty() || f.size() > 18) return -1;
  int64_t v = 0;
  for (const char c : f) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v;
}

constexpr const char* kFamilies[] = {"linear", "gemv", "gemm", "quant", "nvfp4"};
constexpr size_t kMaxName = 64;

bool known_family(const std::string& f) {
  for (const char* known : kFamilies)
    if (f == known) return true;
  return false;
}

// The line as a message may quote it: printable ASCII only (the text goes back to Python as str), at most 80 chars.
std::string printable(const std::string& line) {
  std::string out;
  for (const char c : line.substr(0, 80)) out.push_back(c >= 0x20 && c < 0x7f ? c : '?');
  return out;
}

// Row names are identifiers (letters, digits, '_'): anything else cannot name a row, whatever a file says.
bool row_name(const std::string& r) {
  if (r.empty() || r.size() > kMaxName) return false;
  for (const char c : r)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
}

// "family:ROW[,family:ROW...]". ops.py refuses a malformed value at import, so a piece that does not parse here
// can only come from loading the extension without the package: it is skipped.
std::map<std::string, std::string> parse_force(const char* value) {
  std::map<std::string, std::string> out;
  for (const std::string& piece : split(value == nullptr ? "" : value, ',')) {
    const size_t colon = piece.find(':');
    if (colon == std::string::npos) continue;
    const std::string family = trim(piece.substr(0, colon)), row = trim(piece.substr(colon + 1));
    if (known_family(family) && row_name(row)) out[family] = row;
  }
  return out;
}

// Read on first use, never changed afterwards: forced() hands out pointers into it.
const std::map<std::string, std::string>& force_map() {
  static const std::map<std::string, std::string> m = parse_force(std::getenv("BLOCKFP8_FORCE"));
  return m;
}

// The table in force: published by a release store after it is complete, read lock-free on every op call.
std::atomic<const TunedTable*> g_tuned{nullptr};

// Owns every table set_tuned built; appended under the lock, never shrunk (readers may hold old pointers).
std::vector<std::unique_ptr<const TunedTable>>& loaded_tables() {
  static std::vector<std::unique_ptr<const TunedTable>> all;
  return all;
}
std::mutex& loaded_mutex() {
  static std::mutex mu;
  return mu;
}

}  // namespace

const char* forced(const char* family) {
  const auto& m = force_map();
  if (m.empty()) return nullptr;
  const auto it = m.find(family);
  return it == m.end() ? nullptr : it->second.c_str();
}

const TunedTable* tuned() { return g_tuned.load(std::memory_order_acquire); }

const char* tuned_row(const TunedTable& table, const char* family, int64_t m, int64_t n, int64_t k) {
  for (const TunedEntry& e : table)
    if (e.n == n && e.k == k && e.m_min <= m && m <= e.m_max && e.family == family) return e.row.c_str();
  return nullptr;
}

std::string set_tuned(const std::string& text) {
  auto table = std::make_unique<TunedTable>();
  int number = 0;
  for (const std::string& line : split(text, '\n')) {
    ++number;
    const std::vector<std::string> f = fields_of(line);
    if (f.empty()) continue;
    TunedEntry e;
    if (f.size() == 6) {
      e.family = f[0], e.n = parse_count(f[1]), e.k = parse_count(f[2]), e.m_min = parse_count(f[3]);
      e.m_max = parse_count(f[4]), e.row = f[5];
    }
    if (f.size() != 6 || e.n < 0 || e.k < 0 || e.m_min < 0 || e.m_max < 0)
      return "line " + std::to_string(number) + ": expected 'family n k m_min m_max row', got '" + printable(line) +
             "'";
    if (e.n < 1 || e.k < 1 || e.m_min < 1 || e.m_max < e.m_min)
      return "line " + std::to_string(number) + ": needs n, k >= 1 and 1 <= m_min <= m_max";
    if (!known_family(e.family)) return "line " + std::to_string(number) + ": unknown family '" + e.family + "'";
    if (!row_name(e.row))
      return "line " + std::to_string(number) + ": a row name is 1-64 letters, digits or '_'";
    table->push_back(std::move(e));
  }
  const TunedTable* next = nullptr;
  if (!table->empty()) {
    std::lock_guard<std::mutex> lock(loaded_mutex());
    next = table.get();
    loaded_tables().push_back(std::move(table));
  }
  g_tuned.store(next, std::memory_order_release);
  return std::string();
}

std::string tuned_text() {
  const TunedTable* table = tuned();
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
