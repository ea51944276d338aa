// The one alignment rule of every kernel that reads 16-bit activation rows as 16-byte vectors
// (GEMV, quantizer): the first row starts on 16 bytes and the row stride keeps every row there
// (a multiple of 8 elements); a single row needs no stride.
#pragma once

#include <cstdint>

namespace blockfp8 {

inline bool rows_16byte_aligned(const void* x, int64_t rows, int64_t stride_elems) {
  return reinterpret_cast<uintptr_t>(x) % 16 == 0 && (rows <= 1 || stride_elems % 8 == 0);
}

constexpr const char* kRowsNot16ByteAligned =
    "x rows must be 16-byte aligned (data pointer % 16 == 0, x_stride % 8 == 0)";

}  // namespace blockfp8
