// What each arch's W8A8 GEMM exports to the family router (gemm.cpp). Every arch directory (sm89/, sm90/,
// sm120/) defines these six functions in its own namespace, with gemm.h's contract for each; gemm.cpp routes a
// Problem to the arch named by Problem::arch. An arch is compiled in only when setup.py builds it, which defines
// BLOCKFP8_HAS_SM<arch>_GEMM for every file.
#pragma once

#include "gemm.h"

#define BLOCKFP8_GEMM_ARCH_API                                  \
  int num_rows();                                               \
  const TileRow& row(int i);                                    \
  const char* rejects(const Problem& p);                        \
  Plan plan(const Problem& p, int forced_row);                  \
  size_t workspace_bytes(const Problem& p, const Plan& plan);   \
  cudaError_t launch(const Problem& p, const Plan& plan, cudaStream_t s);

namespace blockfp8::gemm {
#ifdef BLOCKFP8_HAS_SM89_GEMM
namespace sm89 {
BLOCKFP8_GEMM_ARCH_API
}
#endif
#ifdef BLOCKFP8_HAS_SM90_GEMM
namespace sm90 {
BLOCKFP8_GEMM_ARCH_API
}
#endif
#ifdef BLOCKFP8_HAS_SM120_GEMM
namespace sm120 {
BLOCKFP8_GEMM_ARCH_API
}
#endif
}  // namespace blockfp8::gemm

#undef BLOCKFP8_GEMM_ARCH_API
