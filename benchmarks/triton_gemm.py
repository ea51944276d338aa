"""Our Triton block-FP8 W8A8 GEMM: a peer written by this project for comparison, not shipped.

Math: out[m, n] = sum_kb sa[m, kb] * sb[n // 128, kb] * sum_{k in block kb} a[m, k] * b[n, k],
accumulated in fp32, rounded once to bf16/fp16. Each 128-wide K step is one tl.dot into a fresh
fp32 tile that is scaled and added to the accumulator, so the per-block scales are applied in fp32
once per block (the tensor cores' reduced-precision FP8 accumulation never spans two blocks).
Layouts: a fp8 e4m3 [M, K] (K contiguous); a_scale fp32 [M, K/128] with any strides (the M-major
(1, round_up(M, 4)) layout of ops.per_token_group_quant makes the per-step scale load one
coalesced vector); b fp8 e4m3 [N, K] (K contiguous, "NT"); b_scale fp32 [ceil(N/128), K/128].
Arch: fp8 tl.dot needs SM89+; timed on SM90 (H200). Unsupported: K % 128 != 0 (no K masking; the
scale block is the K step). Ragged M and N are masked. Configs are fixed per M bucket, no autotune.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

BLOCK_K = 128  # = the scale block: one scale pair per K step


@dataclass(frozen=True)
class Config:
    max_m: int
    block_m: int
    block_n: int        # divides 128, so an N tile sits inside one weight-scale row
    group_m: int
    num_warps: int
    num_stages: int
    reason: str


# First row with max_m >= M wins. Shared memory per stage = (block_m + block_n) * 128 bytes.
CONFIGS = (
    Config(16, 16, 64, 1, 4, 6, "decode: smallest dot M; weight streaming wants deep pipelining"),
    Config(64, 32, 64, 4, 4, 5, "small M: 64-wide N tiles keep >= 1 tile per SM for N >= 8448"),
    Config(256, 64, 128, 8, 4, 4, "mid M: one warpgroup MMA per tile, 96 KB of stages"),
    Config(1 << 62, 128, 128, 8, 8, 4, "prefill: 128x128 tiles, 2 warpgroups, 128 KB of stages"),
)


def config_for(m: int, n: int, sm_count: int) -> Config:
    cfg = next(c for c in CONFIGS if m <= c.max_m)
    # Small M streams the weight: halve the N tile while the grid would leave SMs idle.
    if cfg.block_m <= 32:
        block_n = cfg.block_n
        while block_n > 32 and triton.cdiv(n, block_n) * triton.cdiv(m, cfg.block_m) < sm_count:
            block_n //= 2
        if block_n != cfg.block_n:
            cfg = Config(cfg.max_m, cfg.block_m, block_n, cfg.group_m, cfg.num_warps,
                         cfg.num_stages, cfg.reason + f"; N tile {block_n} to fill {sm_count} SMs")
    return cfg


# M and the scale column stride round_up(M, 4) change with every M: specializing on them would
# recompile each config per M for nothing (they only bound masks and offsets).
@triton.jit(do_not_specialize=["M", "stride_sak"])
def _block_fp8_gemm_kernel(a_ptr, b_ptr, out_ptr, sa_ptr, sb_ptr, M, N, K,
                           stride_am, stride_bn, stride_om,
                           stride_sam, stride_sak, stride_sbn, stride_sbk,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    # Grouped order: GROUP_M consecutive programs share one column of B tiles while it is in L2.
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    rows_in_group = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % rows_in_group
    pid_n = (pid % per_group) // rows_in_group

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    in_m = offs_m < M
    in_n = offs_n < N
    a_ptrs = a_ptr + offs_m.to(tl.int64)[:, None] * stride_am + offs_k[None, :]
    b_ptrs = b_ptr + offs_n.to(tl.int64)[None, :] * stride_bn + offs_k[:, None]
    sa_ptrs = sa_ptr + offs_m * stride_sam
    sb_row = sb_ptr + ((pid_n * BLOCK_N) // 128) * stride_sbn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=in_m[:, None], other=0.0)
        b = tl.load(b_ptrs, mask=in_n[None, :], other=0.0)
        sa = tl.load(sa_ptrs + kb * stride_sak, mask=in_m, other=0.0)
        sb = tl.load(sb_row + kb * stride_sbk)
        acc += tl.dot(a, b) * (sa[:, None] * sb)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K

    o_ptrs = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=in_m[:, None] & in_n[None, :])


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def rejects(m: int, n: int, k: int) -> str | None:
    """Why this GEMM cannot run a shape, or None."""
    if k % BLOCK_K:
        return f"K={k} is not a multiple of {BLOCK_K} (the K step is the scale block)"
    return None


def block_fp8_gemm(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                   out_dtype: torch.dtype = torch.bfloat16, config: Config | None = None
                   ) -> torch.Tensor:
    """out [M, N] = dequant(a, 1x128) @ dequant(b, 128x128)^T, fp32 accumulate, out_dtype."""
    m, k = a.shape
    n = b.shape[0]
    why = rejects(m, n, k)
    if why:
        raise ValueError(why)
    if a.stride(1) != 1 or b.stride(1) != 1:
        raise ValueError("a and b must have K contiguous")
    if tuple(a_scale.shape) != (m, k // BLOCK_K):
        raise ValueError(f"a_scale must be [{m}, {k // BLOCK_K}], got {tuple(a_scale.shape)}")
    if tuple(b_scale.shape) != (triton.cdiv(n, 128), k // BLOCK_K):
        raise ValueError(f"b_scale must be [{triton.cdiv(n, 128)}, {k // BLOCK_K}], "
                         f"got {tuple(b_scale.shape)}")
    if config is None:
        config = config_for(m, n, _sm_count(a.device.index or 0))
    out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    grid = (triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n),)
    _block_fp8_gemm_kernel[grid](
        a, b, out, a_scale, b_scale, m, n, k,
        a.stride(0), b.stride(0), out.stride(0),
        a_scale.stride(0), a_scale.stride(1), b_scale.stride(0), b_scale.stride(1),
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=BLOCK_K, GROUP_M=config.group_m,
        num_warps=config.num_warps, num_stages=config.num_stages)
    return out
