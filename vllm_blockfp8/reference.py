"""The one pure-PyTorch reference for every op of the package.

Tests, benchmarks, evals, the checkpoint tool and the CPU backend all call these functions, so a
kernel is always checked against the same math. Conventions (DESIGN.md):

* ``scale`` always multiplies to dequantize: ``w = q * s``.
* Block FP8 weights: ``q`` float8_e4m3fn [N, K], ``s`` fp32 [ceil(N/128), ceil(K/128)].
* Activations: one fp32 scale per token per ``group_size`` (128) values of K.
* NVFP4 (ModelOpt): ``packed`` uint8 [N, K/2], two E2M1 codes per byte, element 2i in the low
  nibble; ``scale`` float8_e4m3fn [N, K/16]; ``global_scale`` fp32 scalar (``weight_scale_2``);
  ``w = e2m1 * scale * global_scale``.

Quantizers are bit-exact contracts: the CUDA quantizer must produce the same bytes.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
FP4_MAX = 6.0
BLOCK = 128
NVFP4_GROUP = 16
# Smallest group amax used to form a scale: keeps all-zero groups finite (q = 0, s = tiny).
AMAX_FLOOR = 1e-10

# E2M1 magnitudes by code (bit 3 is the sign).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _fp32_div(a: torch.Tensor, divisor: float) -> torch.Tensor:
    """a / divisor, the IEEE fp32 division on every device. A Python number as the divisor would
    not do on CUDA: there torch multiplies by its rounded reciprocal (1/448 is inexact), which
    misses the division by one ulp on some values and then moves a quantized value by one step."""
    return a / torch.full_like(a, divisor)


# --------------------------------------------------------------------------------------------
# Block FP8
# --------------------------------------------------------------------------------------------


def quantize_per_token_group(x: torch.Tensor, group_size: int = BLOCK):
    """Quantize activations x [M, K] to FP8 with one scale per token per ``group_size`` of K.

    Returns (q float8_e4m3fn [M, K], s fp32 [M, K // group_size], contiguous).
    scale = max(amax, 1e-10) / 448 in fp32; q = round_to_nearest_even(x_fp32 / scale), saturated
    to +-448 (the division is the IEEE fp32 one, so a CUDA kernel can match it bit for bit).
    """
    if x.dim() != 2 or x.shape[1] % group_size:
        raise ValueError(f"x must be [M, K] with K % {group_size} == 0, got {tuple(x.shape)}")
    m, k = x.shape
    groups = x.float().reshape(m, k // group_size, group_size)
    amax = groups.abs().amax(dim=-1).clamp_min(AMAX_FLOOR)
    scale = _fp32_div(amax, FP8_MAX)
    q = (groups / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.reshape(m, k), scale.contiguous()


def dequantize_per_token_group(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`quantize_per_token_group` in fp32 (s may have any strides)."""
    m, k = q.shape
    group_size = k // s.shape[1]
    return (q.float().reshape(m, -1, group_size) * s.float().unsqueeze(-1)).reshape(m, k)


def quantize_block_fp8(w: torch.Tensor, block: int = BLOCK):
    """Quantize a weight w [N, K] to FP8 with one fp32 scale per block x block tile.

    Edge tiles (N or K not a multiple of ``block``) use the amax of the elements they hold.
    Returns (q float8_e4m3fn [N, K], s fp32 [ceil(N/block), ceil(K/block)]).
    """
    if w.dim() != 2:
        raise ValueError(f"w must be 2-D [N, K], got {tuple(w.shape)}")
    n, k = w.shape
    nb, kb = _ceil_div(n, block), _ceil_div(k, block)
    padded = torch.zeros(nb * block, kb * block, dtype=torch.float32, device=w.device)
    padded[:n, :k] = w.float()
    tiles = padded.reshape(nb, block, kb, block)
    amax = tiles.abs().amax(dim=(1, 3)).clamp_min(AMAX_FLOOR)
    scale = _fp32_div(amax, FP8_MAX)
    q = (tiles / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.reshape(nb * block, kb * block)[:n, :k].contiguous(), scale.contiguous()


def expand_block_scale(s: torch.Tensor, n: int, k: int, block: int = BLOCK) -> torch.Tensor:
    """Broadcast block scales [ceil(N/b), ceil(K/b)] to one fp32 value per element [N, K]."""
    return s.float().repeat_interleave(block, 0)[:n].repeat_interleave(block, 1)[:, :k]


def dequantize_block_fp8(q: torch.Tensor, s: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """w = q * s per block, in fp32, [N, K]."""
    n, k = q.shape
    return q.float() * expand_block_scale(s, n, k, block)


# --------------------------------------------------------------------------------------------
# NVFP4 (ModelOpt)
# --------------------------------------------------------------------------------------------


def _e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """Round fp32 values (already divided by their scale) to E2M1 codes, nearest, ties to even."""
    mag = v.abs()
    # Midpoints between neighbouring magnitudes; '<=' at an even-mantissa upper neighbour and '<'
    # at an odd one gives round-half-to-even on the E2M1 grid.
    code = torch.zeros_like(mag, dtype=torch.uint8)
    code = torch.where(mag > 0.25, 1, code)
    code = torch.where(mag >= 0.75, 2, code)
    code = torch.where(mag > 1.25, 3, code)
    code = torch.where(mag >= 1.75, 4, code)
    code = torch.where(mag > 2.5, 5, code)
    code = torch.where(mag >= 3.5, 6, code)
    code = torch.where(mag > 5.0, 7, code)
    sign = (v < 0) & (code > 0)
    return (code | (sign.to(torch.uint8) << 3)).to(torch.uint8)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (uint8, low 4 bits) to fp32 values (E2M1_VALUES by magnitude code).

    Arithmetic, not a table lookup: a table would be a host tensor copied to the device on every
    call, which CUDA graph capture refuses. exponent e = bits 1-2, mantissa m = bit 0:
    e == 0 -> 0.5 m (subnormal), else 2^(e-1) (1 + m / 2).
    """
    e = ((codes >> 1) & 3).float()
    m = (codes & 1).float()
    mag = torch.where(e == 0, 0.5 * m, torch.exp2(e - 1) * (1 + 0.5 * m))
    return torch.where((codes & 8) != 0, -mag, mag)


def quantize_nvfp4(w: torch.Tensor):
    """Quantize w [N, K] (K % 32 == 0) to ModelOpt NVFP4.

    global_scale = amax(w) / (6 * 448); per 16 values scale = e4m3(amax_16 / 6 / global_scale);
    codes = e2m1(w / (scale * global_scale)). Returns (packed uint8 [N, K/2], scale e4m3
    [N, K/16], global_scale fp32 0-dim).
    """
    if w.dim() != 2 or w.shape[1] % (2 * NVFP4_GROUP):
        raise ValueError(f"w must be [N, K] with K % 32 == 0, got {tuple(w.shape)}")
    n, k = w.shape
    wf = w.float()
    global_scale = _fp32_div(wf.abs().amax().clamp_min(AMAX_FLOOR), FP4_MAX * FP8_MAX).to(torch.float32)
    groups = wf.reshape(n, k // NVFP4_GROUP, NVFP4_GROUP)
    amax = groups.abs().amax(dim=-1)
    scale = (_fp32_div(amax, FP4_MAX) / global_scale).clamp(max=FP8_MAX).to(FP8_DTYPE)
    denom = scale.float() * global_scale
    denom = torch.where(denom > 0, denom, torch.ones_like(denom))
    codes = _e2m1_codes(groups / denom.unsqueeze(-1)).reshape(n, k)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed.contiguous(), scale.contiguous(), global_scale


def dequantize_nvfp4(packed: torch.Tensor, scale: torch.Tensor, global_scale) -> torch.Tensor:
    """w = e2m1 * scale * global_scale in fp32, [N, K]. global_scale: a number, a 0-dim tensor, or a
    tensor of one value per row ([N] or [N, 1]: fused shards keep their own)."""
    n = packed.shape[0]
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(n, -1)
    values = e2m1_decode(codes).reshape(n, -1, NVFP4_GROUP) * scale.float().unsqueeze(-1)
    if isinstance(global_scale, torch.Tensor):
        gs = global_scale.float()
        gs = gs.reshape(-1, 1, 1) if gs.numel() == n and n != 1 else gs.reshape(())
    else:
        gs = float(global_scale)
    return (values * gs).reshape(n, -1)


# The paired packing: what the weight-only kernels read (made once at load, ``pair_nvfp4_weight``). Each aligned
# 32-bit little-endian word of ModelOpt's packing holds elements 8w .. 8w + 7 (element e in bits 4e .. 4e + 3:
# mantissa, exponent low, exponent high, sign). The paired word holds the same 8 codes with their bits moved so that
# pair j = (element 2j, element 2j + 1) decodes as two 16-bit lanes with one shift and one mask (csrc/fp4/decode.cuh):
# after rotl(word, (6, 2, 28)[j]) & 0x81C081C0 (pairs 0-2), or (word & 0x81808180) | ((word >> 8) & 0x00400040)
# (pair 3), element 2j's mantissa, exponent and sign sit at bits 6, 7-8, 15 and element 2j + 1's at 22, 23-24, 31:
# the bf16 operand bits of e2m1 * 2^-126. NVFP4_PAIRED_BITS[e] lists element e's (mantissa, exponent low, exponent
# high, sign) bit positions in the paired word.
NVFP4_PAIRED_BITS = ((0, 1, 2, 9), (16, 17, 18, 25), (4, 5, 6, 13), (20, 21, 22, 29),
                     (10, 11, 12, 19), (26, 27, 28, 3), (14, 7, 8, 15), (30, 23, 24, 31))


def _paired_rotations(inverse: bool) -> list:
    """[(r, mask)]: the paired word is OR_r rotl(word, r) & mask (the inverse: of the paired word)."""
    groups: dict = {}
    for element, bits in enumerate(NVFP4_PAIRED_BITS):
        for i, dst in enumerate(bits):
            src = 4 * element + i
            if inverse:
                src, dst = dst, src
            r = (dst - src) % 32
            groups[r] = groups.get(r, 0) | (1 << dst)
    return sorted(groups.items())


def _permute_words(b: torch.Tensor, inverse: bool) -> torch.Tensor:
    if b.dtype != torch.uint8 or b.dim() != 2 or b.shape[1] % 4:
        raise ValueError(f"the packed weight must be uint8 [N, K/2] with K % 8 == 0, got {b.dtype} {tuple(b.shape)}")
    words = b.contiguous().view(torch.int32)
    out = torch.empty_like(words)
    rotations = _paired_rotations(inverse)
    for r0 in range(0, words.shape[0], 4096):  # int64 temporaries of at most 4096 rows
        w = words[r0:r0 + 4096].to(torch.int64) & 0xFFFFFFFF
        acc = torch.zeros_like(w)
        for r, mask in rotations:
            rotated = ((w << r) | (w >> (32 - r))) & 0xFFFFFFFF if r else w
            acc |= rotated & mask
        out[r0:r0 + 4096] = torch.where(acc >= 1 << 31, acc - (1 << 32), acc).to(torch.int32)
    return out.view(torch.uint8).reshape(b.shape)


def pair_nvfp4_weight(b: torch.Tensor) -> torch.Tensor:
    """ModelOpt packing uint8 [N, K/2] -> the paired packing (same shape and bytes per row; see above)."""
    return _permute_words(b, inverse=False)


def unpair_nvfp4_weight(b_paired: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pair_nvfp4_weight`."""
    return _permute_words(b_paired, inverse=True)


# The fragment packing: what the SM90 layer stores (made once at load, ``fragment_nvfp4_weight``), so that each lane
# of the tensor-core kernels loads exactly the codes of its mma A fragment and decodes whole words. For each 16-row
# tile T and 64-deep K stage S a block of 512 bytes at (T * K / 64 + S) * 512; lane l = 4 g + t's 16 bytes at
# 16 l are four paired words (one per k16 step kk), word kk holding elements (row g, k 2t), (g, 2t + 1), (g + 8, 2t),
# (g + 8, 2t + 1), (g, 2t + 8), (g, 2t + 9), (g + 8, 2t + 8), (g + 8, 2t + 9) at k relative to 64 S + 16 kk, in that
# element order: the paired decode's 4 pairs are the fragment registers a[0..3] of mma.sync m16n8k16 and of one
# warp's share of wgmma m64nNk16 (csrc/fp4/fragment.cuh).
# Its scales are exp8 bytes, in the same blocks: 64 bytes per (T, S) at (T * K / 64 + S) * 64, lane group g's 8 at
# 8 g (row g's steps 0-3, then row g + 8's). exp8 = (bf16 exponent field of scale * 2^119 - 237) << 3 | its top 3
# mantissa bits: every positive e4m3 value is exact in a byte (fields 237 = 2^-9 * 2^119, the smallest subnormal,
# to 254 = 448 * 2^119), and the bf16 bits are (byte << 4) + 0x7680. Zero has no byte: a zero-scale group's codes
# are zeroed (its products are zero either way) and its byte is 0. Negative or NaN scales are refused.
FRAGMENT_ROWS = 16
FRAGMENT_K = 64


def fragment_packing_rejects(n: int, k: int) -> Optional[str]:
    """None if an [N, K] NVFP4 weight can take the fragment packing, else why not."""
    if n % FRAGMENT_ROWS:
        return f"N = {n} is not a multiple of {FRAGMENT_ROWS} (16-row mma tiles)"
    if k % FRAGMENT_K:
        return f"K = {k} is not a multiple of {FRAGMENT_K} (64-deep stages)"
    return None


def exp8_scales(scale: torch.Tensor) -> torch.Tensor:
    """e4m3 scales (any shape) -> their exp8 bytes (uint8, same shape); zero -> 0. ValueError on a negative or NaN
    scale."""
    s = scale.float()
    if bool(torch.isnan(s).any()) or bool((s < 0).any()):
        raise ValueError("the fragment packing needs non-negative, finite NVFP4 weight scales")
    bits = (s * 2.0 ** 119).view(torch.int32)
    field, mantissa = (bits >> 23) & 0xFF, (bits >> 20) & 7
    return torch.where(s > 0, ((field - 237) << 3) | mantissa, torch.zeros_like(bits)).to(torch.uint8)


def exp8_decode(e: torch.Tensor, zero: Optional[torch.Tensor] = None) -> torch.Tensor:
    """exp8 bytes -> the scale values (fp32); where ``zero`` (bool) is set, 0."""
    bits = ((e.to(torch.int32) << 4) + 0x7680) << 16
    v = bits.view(torch.float32) * 2.0 ** -119
    return v if zero is None else torch.where(zero, torch.zeros_like(v), v)


def _fragment_order(t: torch.Tensor, n: int, k: int, per_k: int) -> torch.Tensor:
    """[N, K * per_k / 16 ...] viewed as the fragment packing's (T, half, g, S, kk, [hi, t, j]) and permuted to its
    memory order (T, S, g, [t, kk, hi,] half, [j])."""
    if per_k == 16:  # one value per element: [N, K]
        v = t.reshape(n // 16, 2, 8, k // 64, 4, 2, 4, 2)  # T, half, g, S, kk, hi, t, j
        return v.permute(0, 3, 2, 6, 4, 5, 1, 7).reshape(-1)
    v = t.reshape(n // 16, 2, 8, k // 64, 4)  # one per group: T, half, g, S, kk
    return v.permute(0, 3, 2, 1, 4).reshape(-1)


def fragment_nvfp4_weight(b: torch.Tensor, scale: torch.Tensor) -> tuple:
    """ModelOpt packing uint8 [N, K/2] and e4m3 scales [N, K/16] -> (codes uint8 [N, K/2], exp8 uint8 [N, K/16]) in
    the fragment packing (see above; the shapes only size the buffers). ValueError where the packing does not apply
    (:func:`fragment_packing_rejects`) or a scale is negative or NaN."""
    if b.dtype != torch.uint8 or b.dim() != 2 or scale.dim() != 2:
        raise ValueError(f"the packed weight must be uint8 [N, K/2], got {b.dtype} {tuple(b.shape)}")
    n, k = b.shape[0], 2 * b.shape[1]
    if tuple(scale.shape) != (n, k // NVFP4_GROUP):
        raise ValueError(f"the scales must be [N, K/16] = {[n, k // NVFP4_GROUP]}, got {list(scale.shape)}")
    if (why := fragment_packing_rejects(n, k)) is not None:
        raise ValueError(f"the fragment packing does not apply: {why}")
    e8 = exp8_scales(scale)
    codes = torch.stack((b & 0xF, b >> 4), dim=-1).reshape(n, k // NVFP4_GROUP, NVFP4_GROUP)
    codes = torch.where((scale.float() > 0).unsqueeze(-1), codes, torch.zeros_like(codes)).reshape(n, k)
    ordered = _fragment_order(codes, n, k, 16).reshape(-1, 2)  # element pairs of each word, in element order
    modelopt = (ordered[:, 0] | (ordered[:, 1] << 4)).reshape(n, k // 2)
    return pair_nvfp4_weight(modelopt), _fragment_order(e8, n, k, 1).reshape(n, k // NVFP4_GROUP)


def unfragment_nvfp4_weight(codes: torch.Tensor, exp8: torch.Tensor) -> tuple:
    """Inverse of :func:`fragment_nvfp4_weight` up to the zeroed groups: (ModelOpt packing uint8 [N, K/2], scales
    fp32 [N, K/16]) of the weight the fragment packing holds."""
    n, k = codes.shape[0], 2 * codes.shape[1]
    words = unpair_nvfp4_weight(codes).reshape(-1)
    ordered = torch.stack((words & 0xF, words >> 4), dim=-1).reshape(-1)
    index = _fragment_order(torch.arange(n * k, device=codes.device), n, k, 16)
    plain = torch.empty_like(ordered)
    plain[index] = ordered
    plain = plain.reshape(n, k)
    s_index = _fragment_order(torch.arange(n * k // NVFP4_GROUP, device=codes.device), n, k, 1)
    e_plain = torch.empty_like(exp8.reshape(-1))
    e_plain[s_index] = exp8.reshape(-1)
    zero = (plain.reshape(n, k // NVFP4_GROUP, NVFP4_GROUP) == 0).all(dim=-1)
    scale = exp8_decode(e_plain.reshape(n, k // NVFP4_GROUP), zero)
    return (plain[:, 0::2] | (plain[:, 1::2] << 4)).contiguous(), scale


# --------------------------------------------------------------------------------------------
# Native NVFP4 x NVFP4 (W4A4, SM120): activation quantizer and the GEMM's scale-factor layout
# --------------------------------------------------------------------------------------------


def nvfp4_sf_shape(rows: int, k: int) -> tuple:
    """Padded [rows, K/16] of the swizzled scales: rows to a multiple of 128, columns to one of 4."""
    return _ceil_div(rows, 128) * 128, _ceil_div(k // NVFP4_GROUP, 4) * 4


def nvfp4_sf_offsets(rows: int, k: int, device=None) -> torch.Tensor:
    """int64 [padded rows, padded K/16]: the byte of the swizzled buffer holding scale (r, c).

    CUTLASS's Sm1xxBlockScaledConfig<16> layout (SfKMajorAtom tiled K-first, csrc/fp4/native.h): atoms
    of 128 rows x 4 columns (512 bytes), atom (r // 128, c // 4) at ((r // 128) * (cols // 4) + c // 4) * 512,
    inside it (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4. A bijection onto range(rows * cols).
    """
    pr, pc = nvfp4_sf_shape(rows, k)
    r = torch.arange(pr, device=device).unsqueeze(1)
    c = torch.arange(pc, device=device).unsqueeze(0)
    return ((r // 128) * (pc // 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4


def swizzle_nvfp4_scale(scale: torch.Tensor) -> torch.Tensor:
    """Plain e4m3 scales [rows, K/16] -> the GEMM's layout: e4m3 [padded rows, padded K/16] whose bytes, read
    in memory order, are the swizzled buffer (the shape only sizes it). Padding is 0."""
    rows, groups = scale.shape
    pr, pc = nvfp4_sf_shape(rows, groups * NVFP4_GROUP)
    plain = torch.zeros(pr, pc, dtype=torch.uint8, device=scale.device)
    plain[:rows, :groups] = scale.view(torch.uint8)
    out = torch.empty(pr * pc, dtype=torch.uint8, device=scale.device)
    out[nvfp4_sf_offsets(rows, groups * NVFP4_GROUP, scale.device).reshape(-1)] = plain.reshape(-1)
    return out.view(FP8_DTYPE).reshape(pr, pc)


def unswizzle_nvfp4_scale(swizzled: torch.Tensor, rows: int, k: int) -> torch.Tensor:
    """Inverse of :func:`swizzle_nvfp4_scale`: the plain e4m3 [rows, K/16]."""
    offsets = nvfp4_sf_offsets(rows, k, swizzled.device)[:rows, : k // NVFP4_GROUP]
    return swizzled.reshape(-1).view(torch.uint8)[offsets].view(FP8_DTYPE)


def quantize_nvfp4_activations(x: torch.Tensor, input_scale):
    """Quantize x [M, K] (K % 32 == 0) to NVFP4 with a calibrated global scale, as the CUDA quantizer does.

    ``input_scale`` is the checkpoint's (ModelOpt) activation scale, amax / (6 * 448): it multiplies to
    dequantize (vLLM's scaled_fp4_quant takes its reciprocal). Per 16 values, in fp32:
    s = e4m3(min(amax_16 / 6 / input_scale, 448)) (two IEEE divisions, round to nearest even),
    d = s * input_scale, code = e2m1(x / d) (nearest, ties to even, saturating at 6), or 0 where d == 0.
    Returns (packed uint8 [M, K/2], scale e4m3 [M, K/16] plain row-major; the op returns it swizzled).
    """
    if x.dim() != 2 or x.shape[1] % (2 * NVFP4_GROUP):
        raise ValueError(f"x must be [M, K] with K % 32 == 0, got {tuple(x.shape)}")
    m, k = x.shape
    gs = input_scale.float().reshape(()) if isinstance(input_scale, torch.Tensor) else torch.tensor(float(input_scale))
    gs = gs.to(x.device)
    groups = x.float().reshape(m, k // NVFP4_GROUP, NVFP4_GROUP)
    amax = groups.abs().amax(dim=-1)
    scale = (_fp32_div(amax, FP4_MAX) / gs).clamp(max=FP8_MAX).to(FP8_DTYPE)
    d = (scale.float() * gs).unsqueeze(-1)
    codes = torch.where(d > 0, _e2m1_codes(groups / torch.where(d > 0, d, torch.ones_like(d))),
                        torch.zeros((), dtype=torch.uint8, device=x.device)).reshape(m, k)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed.contiguous(), scale.contiguous()


def nvfp4_gemm_ref(a, a_scale, b, b_scale, alpha) -> torch.Tensor:
    """Native W4A4 in float64: alpha * dequant(a) @ dequant(b)^T, scales plain [rows, K/16]."""
    wa = dequantize_nvfp4(a, a_scale, 1.0).double()
    wb = dequantize_nvfp4(b, b_scale, 1.0).double()
    alpha = alpha.double().reshape(()) if isinstance(alpha, torch.Tensor) else float(alpha)
    return (wa @ wb.t()) * alpha


def nvfp4_w4a4_linear_ref(x, input_scale, packed, scale, global_scale, bias=None) -> torch.Tensor:
    """The native path's math in float64: x quantized to NVFP4 with ``input_scale``, times the NVFP4 weight."""
    lead, k = x.shape[:-1], x.shape[-1]
    qa, sa = quantize_nvfp4_activations(x.reshape(-1, k), input_scale)
    xa = dequantize_nvfp4(qa, sa, input_scale).double()
    out = xa @ dequantize_nvfp4(packed, scale, global_scale).double().t()
    if bias is not None:
        out = out + bias.double()
    return out.reshape(*lead, -1)


# --------------------------------------------------------------------------------------------
# GEMM / GEMV / linear references (computed in float64 so they are the "exact" answer)
# --------------------------------------------------------------------------------------------


def gemv_ref(x: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor) -> torch.Tensor:
    """Weight-only: x [M, K] (16-bit) @ dequant(b)^T in float64 -> [M, N] float64."""
    w = dequantize_block_fp8(b, b_scale).double()
    return x.double() @ w.t()


def gemm_ref(a, a_scale, b, b_scale) -> torch.Tensor:
    """W8A8: dequant(a, 1x128) @ dequant(b, 128x128)^T in float64 -> [M, N] float64."""
    return dequantize_per_token_group(a, a_scale).double() @ dequantize_block_fp8(b, b_scale).double().t()


def linear_ref(x, b, b_scale, bias=None, *, quantize_activations: bool) -> torch.Tensor:
    """The full linear in float64: weight-only (GEMV rows) or with 1x128 activation quant (W8A8)."""
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    if quantize_activations:
        out = gemm_ref(*quantize_per_token_group(x2), b, b_scale)
    else:
        out = gemv_ref(x2, b, b_scale)
    if bias is not None:
        out = out + bias.double()
    return out.reshape(*lead, -1)


def nvfp4_linear_ref(x, packed, scale, global_scale, bias=None, weight_dtype=None) -> torch.Tensor:
    """Weight-only NVFP4 linear in float64. ``weight_dtype``: the dequantized weight (global scale included) rounded
    to that type first, as the dequantize + cuBLAS row (``fp4_dequant_cublas``) holds it."""
    lead, k = x.shape[:-1], x.shape[-1]
    w = dequantize_nvfp4(packed, scale, global_scale)
    if weight_dtype is not None:
        w = w.to(weight_dtype)
    out = x.reshape(-1, k).double() @ w.double().t()
    if bias is not None:
        out = out + bias.double()
    return out.reshape(*lead, -1)


# --------------------------------------------------------------------------------------------
# Tolerances
# --------------------------------------------------------------------------------------------


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half an ulp at 1.0: the relative error of one round-to-nearest into ``dtype``."""
    return {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}[dtype]


def assert_close_to_ref(out: torch.Tensor, ref: torch.Tensor, what: str = "output", *,
                        abs_floor: float = 0.0) -> None:
    """Check a 16-bit kernel output against a float64 reference of the same math.

    The output is rounded once to its dtype: elementwise error <= u * |ref| with u the unit
    roundoff. fp32 accumulation in a different order adds about sqrt(K) * 2^-24 * max|ref|, which
    the extra u/16 * max|ref| term covers up to K ~ 10^6. In norm the rounding error averages
    u / sqrt(3); requiring <= u catches a wrong scale or a lost block while staying deterministic.
    NaN anywhere (a poisoned element left unwritten) fails.

    ``abs_floor`` raises the absolute term to ``abs_floor * max|ref|`` for kernels whose own
    accumulation is coarser than fp32 (FP8 tensor cores: tests/test_gemm.py derives the value),
    and the norm bound to ``max(u, abs_floor)``: that error is biased, not averaged away, when
    every product has one sign (all-positive long K measured 2^-10.6 in norm on the H200).
    """
    if out.shape != ref.shape:
        raise AssertionError(f"{what}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}")
    o = out.detach().double().cpu()
    r = ref.detach().double().cpu()
    if not torch.isfinite(o).all():
        bad = (~torch.isfinite(o)).nonzero()[0].tolist()
        raise AssertionError(f"{what}: non-finite value at {bad} (unwritten or overflowed)")
    u = unit_roundoff(out.dtype)
    scale = r.abs().max().item() if r.numel() else 0.0
    err = (o - r).abs()
    bound = u * r.abs() + max(u / 16, abs_floor) * scale + 1e-30
    if (err > bound).any():
        idx = (err - bound).argmax()
        coord = [int(i) for i in torch.unravel_index(idx, err.shape)]
        raise AssertionError(
            f"{what}: element {coord} = {o.flatten()[idx].item():.6g}, reference "
            f"{r.flatten()[idx].item():.6g} (error {err.flatten()[idx].item():.3g} > bound "
            f"{bound.flatten()[idx].item():.3g})"
        )
    rel = (torch.linalg.vector_norm(o - r) / max(torch.linalg.vector_norm(r).item(), 1e-30)).item()
    rel_bound = max(u, abs_floor)
    if rel > rel_bound:
        raise AssertionError(f"{what}: relative norm error {rel:.3g} > {rel_bound:.3g}")


def first_mismatch(a: torch.Tensor, b: torch.Tensor):
    """First coordinate where two tensors differ bit for bit, or None (for quantizer tests)."""
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

    def raw(t):
        t = t.detach().cpu().contiguous()
        return t.view(bits[t.element_size()]) if t.is_floating_point() else t

    differs = raw(a) != raw(b)
    if differs.dim() == 0:  # a 0-dim tensor has no coordinate: [] says it differs
        return [] if differs.item() else None
    diff = differs.nonzero()
    return None if diff.numel() == 0 else [int(i) for i in diff[0]]


def floor_us(m: int, n: int, k: int, *, bytes_per_s: float, flops_per_s: float,
             activation_bytes: int = 2, quantized_activations: bool = False) -> float:
    """Memory/compute floor of a linear point (BENCHMARKS.md): max(bytes / bw, flops / peak).

    bytes = fp8 weight + fp32 block scales + activations read once + 16-bit output written once.
    """
    weight = n * k + 4 * math.ceil(n / BLOCK) * math.ceil(k / BLOCK)
    act = m * k * (1 if quantized_activations else activation_bytes)
    if quantized_activations:
        act += 4 * m * math.ceil(k / BLOCK)
    total = weight + act + 2 * m * n
    return max(total / bytes_per_s, 2.0 * m * n * k / flops_per_s) * 1e6


# The NVFP4 rows that round the weight itself (global scale folded in) to x's type before the product: the dequantize
# + cuBLAS row (csrc/fp4/dequant.cuh). Every other row rounds once, at the output.
NVFP4_WEIGHT_ROUNDING_ROWS = ("fp4_dequant_cublas",)


def assert_nvfp4_row_close(out, x, packed, scale, global_scale, bias=None, row=None, what="nvfp4") -> None:
    """An nvfp4_linear output (``row``: the row that ran, None for the op's choice) against its float64 reference.
    A weight-rounding row is held to the product of x and that rounded weight, plus 2u of max|ref|: cuBLAS rounds the
    product (its bf16 split-K may reduce in bf16) and the bias is added after that rounding. A wrong scale group
    (~6% of an output at K = 4096) still exceeds it many times."""
    if row in NVFP4_WEIGHT_ROUNDING_ROWS:
        ref = nvfp4_linear_ref(x, packed, scale, global_scale, bias, weight_dtype=out.dtype)
        assert_close_to_ref(out, ref, what, abs_floor=2 * unit_roundoff(out.dtype))
    else:
        assert_close_to_ref(out, nvfp4_linear_ref(x, packed, scale, global_scale, bias), what)
