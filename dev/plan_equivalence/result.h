#pragma once
#include <cstdint>
struct Result {
  int row = -1;
  bool stream_k = false;
  int splits = 1, slices = 1, raster = 0, swizzle = 1, tile_n = 0;
  bool pdl = false, quant_triggers = false, nondet = false;
  bool operator==(const Result& o) const {
    return row == o.row && stream_k == o.stream_k && splits == o.splits && slices == o.slices && raster == o.raster &&
           swizzle == o.swizzle && tile_n == o.tile_n && pdl == o.pdl && quant_triggers == o.quant_triggers &&
           nondet == o.nondet;
  }
};
Result ref_eval(int64_t m, int64_t n, int64_t k, int sms, int forced);
Result new_eval(int64_t m, int64_t n, int64_t k, int sms, int forced);
