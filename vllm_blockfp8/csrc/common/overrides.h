// Rows chosen from outside the tables, consulted by ops.cpp's pick_row when a call requests no row: the row
// BLOCKFP8_FORCE names for a family (read once per process), else a tuned entry for the problem (`blockfp8 tune`'s
// measured winners, loaded through the set_tuned_rows host op). Rows are named, not numbered, because the GEMM's row
// list depends on the table in force. Python validates both (ops.py, tuning.py) and so does this side, before the
// table in force is touched (known family, a row name of letters, digits and '_'): text from a file never reaches a
// table unchecked. A name that does not resolve, or a row that refuses the problem, falls back to the family's own
// choice with one line on stderr.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace blockfp8::overrides {

struct TunedEntry {
  std::string family;
  int64_t n, k, m_min, m_max;  // the entry serves m_min <= M <= m_max
  std::string row;
};

using TunedTable = std::vector<TunedEntry>;

// The row BLOCKFP8_FORCE names for `family` ("linear", "gemv", "gemm", "quant", "nvfp4"), or nullptr.
const char* forced(const char* family);

// The tuned table in force (null when none was loaded). Every table ever loaded is kept for the process (they are a
// few lines, replaced only by set_tuned), so the pointer and the names in it stay valid without a reference count.
const TunedTable* tuned();

// The tuned entry's row for a problem, or nullptr; valid while `table` lives.
const char* tuned_row(const TunedTable& table, const char* family, int64_t m, int64_t n, int64_t k);

// Replaces the tuned table with the entries of `text`, one per line: "family n k m_min m_max row". Returns "" or
// why the text was refused (the table in force is then left as it was). Empty text clears the table.
std::string set_tuned(const std::string& text);

// The table in force in set_tuned's format.
std::string tuned_text();

// Prints "[blockfp8] <message>" to stderr the first time `key` is seen in this process.
void note_once(const std::string& key, const std::string& message);

}  // namespace blockfp8::overrides
