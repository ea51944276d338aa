// One row of a tile table. Each arch file starts with an ordered array of these (plus the
// instantiation the row launches): the first row whose max_m >= M and whose precondition holds
// wins, and the last row is unbounded. The table is the instantiation list, so what is built
// and what is selectable cannot drift. Names are identical in tables, logs and benchmark JSON.
#pragma once

#include <cstdint>

namespace blockfp8 {

struct TileRow {
  const char* name;
  int64_t max_m;
  const char* reason;
};

constexpr int64_t kUnboundedM = INT64_MAX;

// The selection rule every table shares: the first row with max_m >= m whose checks pass
// (rejects(i) == nullptr); -1 if none.
template <typename Row, typename Rejects>
int first_row_taking(const Row* rows, int count, int64_t m, Rejects rejects) {
  for (int i = 0; i < count; ++i)
    if (m <= rows[i].info.max_m && rejects(i) == nullptr) return i;
  return -1;
}

// Checks every arch's row list shares (constexpr, so a table that breaks them does not compile): rows listed in the
// order of their ids, and a row found by its name (the generated units name their row).
template <typename Row, int N>
constexpr bool rows_in_id_order(const Row (&rows)[N]) {
  for (int i = 0; i < N; ++i)
    if (rows[i].id != i) return false;
  return true;
}

constexpr bool same_name(const char* a, const char* b) {
  while (*a != '\0' && *a == *b) ++a, ++b;
  return *a == *b;
}

// The index of the row named `name`, -1 if none.
template <typename Row, int N>
constexpr int row_index(const Row (&rows)[N], const char* name) {
  for (int i = 0; i < N; ++i)
    if (same_name(rows[i].info.name, name)) return i;
  return -1;
}

}  // namespace blockfp8
