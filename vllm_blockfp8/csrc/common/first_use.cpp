// The first-use self-check's row registry (first_use.h has the rule). Host code only: the families' checks launch
// their own kernels.
#include "first_use.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace blockfp8::first_use {
namespace {

constexpr int kMaxTables = 16;
constexpr int kMaxRows = 64;

// detail is written once, before state leaves kUnchecked (release), and read only after state was seen passed or
// failed (acquire).
struct Entry {
  std::atomic<int> state{int(State::kUnchecked)};
  std::string detail;
};

// A (family, table)'s rows. Tables are appended under the lock and published by `count` (release), never moved or
// removed: readers scan the published prefix without the lock.
struct Table {
  char family[16] = {};
  int table = 0;
  Entry rows[kMaxRows];
};

struct Registry {
  Table tables[kMaxTables];
  std::atomic<int> count{0};
  std::mutex mu;  // appends tables; runs one check at a time (each allocates scratch and synchronizes its stream)
};

// A function-local static: the host ops may ask for states while other translation units are still initializing.
Registry& registry() {
  static Registry r;
  return r;
}

Table* find(Registry& r, int n, const char* family, int table) {
  for (int i = 0; i < n; ++i)
    if (r.tables[i].table == table && std::strcmp(r.tables[i].family, family) == 0) return &r.tables[i];
  return nullptr;
}

// The row's entry, its table appended on first sight; nullptr past the capacity.
Entry* entry(const char* family, int table, int index) {
  if (index < 0 || index >= kMaxRows || std::strlen(family) >= sizeof(Table::family)) return nullptr;
  Registry& r = registry();
  Table* t = find(r, r.count.load(std::memory_order_acquire), family, table);
  if (t == nullptr) {
    std::lock_guard<std::mutex> lock(r.mu);
    const int n = r.count.load(std::memory_order_relaxed);
    t = find(r, n, family, table);
    if (t == nullptr) {
      if (n == kMaxTables) return nullptr;
      t = &r.tables[n];
      std::snprintf(t->family, sizeof t->family, "%s", family);
      t->table = table;
      r.count.store(n + 1, std::memory_order_release);
    }
  }
  return &t->rows[index];
}

const char* corrupt_row() {
  static const char* name = std::getenv("BLOCKFP8_SELF_CHECK_CORRUPT");
  return name;
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

// Publishes an outcome (the caller holds the lock): detail first, then the state (release); one warning on a failure.
void store(Entry* e, const Row& row, const Words& words, const std::string& why) {
  e->detail = why;
  if (!why.empty()) {
    std::fprintf(stderr,
                 "[blockfp8] WARNING: %s row %s failed its first-use self-check against the reference: %s. "
                 "The row is disabled for this process (%s).\n",
                 words.what, row.name, why.c_str(), words.fallback);
  }
  e->state.store(int(why.empty() ? State::kPassed : State::kFailed), std::memory_order_release);
}

}  // namespace

bool check_always() {
  static const bool on = [] {
    const char* v = std::getenv("BLOCKFP8_SELF_CHECK");
    return v != nullptr && std::strcmp(v, "always") == 0;
  }();
  return on;
}

State state(const Row& row) {
  const Entry* e = entry(row.family, row.table, row.index);
  return e == nullptr ? State::kPassed : State(e->state.load(std::memory_order_acquire));
}

bool check_now(const Row& row, const Words& words, cudaStream_t s, const Check& check) {
  Entry* e = entry(row.family, row.table, row.index);
  if (e == nullptr) return true;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone)
    return e->state.load(std::memory_order_acquire) == int(State::kPassed);
  std::lock_guard<std::mutex> lock(registry().mu);
  const int st = e->state.load(std::memory_order_acquire);
  if (st != int(State::kUnchecked)) return st == int(State::kPassed);
  const std::string why = check(corrupt_for(row.name));
  store(e, row, words, why);
  return why.empty();
}

bool corrupt_for(const char* name) { return corrupt_row() != nullptr && std::strcmp(corrupt_row(), name) == 0; }

void record(const Row& row, const Words& words, const std::string& why) {
  Entry* e = entry(row.family, row.table, row.index);
  if (e == nullptr) return;
  std::lock_guard<std::mutex> lock(registry().mu);
  if (e->state.load(std::memory_order_acquire) == int(State::kUnchecked)) store(e, row, words, why);
}

std::string states_json(const char* family, int table, int count, const std::function<const char*(int)>& name) {
  std::string out = "[";
  for (int i = 0; i < count; ++i) {
    const Entry* e = entry(family, table, i);
    const int st = e == nullptr ? int(State::kUnchecked) : e->state.load(std::memory_order_acquire);
    if (i) out += ", ";
    out += std::string("{\"name\": \"") + json_escape(name(i)) + "\", \"state\": \"" +
           (st == int(State::kPassed) ? "passed" : st == int(State::kFailed) ? "failed" : "unchecked") +
           "\", \"detail\": \"" + (st == int(State::kUnchecked) ? std::string() : json_escape(e->detail)) + "\"}";
  }
  return out + "]";
}

}  // namespace blockfp8::first_use
