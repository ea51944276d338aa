// The linear op's per-arch tables: which path (weight-only GEMV, activation quant + W8A8 GEMM,
// or dequantize + cuBLAS) serves an M bucket. Each path then picks its own kernel row from its
// family's table. Raw pointers only; ops.cpp does the torch side.
#pragma once

#include <cstdint>

#include "../common/tile_row.h"
#include "../gemm/gemm.h"
#include "../gemv/gemv.h"

namespace blockfp8::linear {

enum class Path { kGemv, kW8A8, kDequantMatmul };

struct Shape {
  int64_t m, n, k;
  int cc;        // the arch whose tables serve the call: table_arch() of the device (major * 10 + minor)
  int sm_count;  // multiprocessors (the kernel tables size grids from it)
};

// Shape-only problems (null pointers, bf16, contiguous operands): what the tables are asked when
// no tensors exist yet (path checks, select_row, row_rejects).
gemv::Problem gemv_shape(const Shape& s);
gemm::Problem gemm_shape(const Shape& s);

// The arch whose tables serve a device: the GEMM family's table (gemm::table_arch: the device's own, or one forced
// for the process) where there is one, else the device's compute capability (the generic table).
int table_arch(int device_cc);

int num_rows(int cc);
const TileRow& row(int cc, int i);
Path path(int cc, int i);
// nullptr when row i can serve the shape, otherwise the reason it cannot.
const char* rejects(int cc, int i, const Shape& s);
int select(const Shape& s);

}  // namespace blockfp8::linear
