"""CPU proof of quant_lane16_rcp's quotient (csrc/quant/quant.cu): no GPU, no extension.

The contract is q = e4m3_satfinite(RN(x / scale)) with the IEEE division. The kernel
computes r = RN(1 / scale) once per group (__frcp_rn) and per value p = RN(x r) (__fmul_rn), rem =
RN(x - p scale) and Q = RN(p + rem r) (__fmaf_rn twice), and converts Q; a pair of values takes
the division instead when either |p| < 2^-6 (or is NaN). ``kernel_quotient`` emulates that on the CPU:
fp32 division and multiplication are IEEE round-to-nearest on the CPU as on the GPU, and ``fma32``
rounds a * b + c once from its exact value. Every test compares the bytes with
reference.quantize_per_token_group, and the fp32 bits of Q with those of x / scale.

Why the sweep is exhaustive for 16-bit inputs: scaling x and amax by a common power of two scales
scale, rem (by 2^k), r (by 2^-k) and leaves p, Q and x / scale unchanged, bit for bit, as long as
nothing leaves fp32's normal range, which holds for every 16-bit amax above the 1e-10 floor (scale
> 2^-43, rem a multiple of ulp(p) ulp(scale) >= 2^-95, r < 2^43, |p| < 448.1); x below amax 2^-16
gives |x / scale| < 2^-7, which takes the division. So every (amax, x) significand pair over the
17 binades of x / scale from 448 down, plus every bf16 value under the floor (the one other scale),
is every input the fast path can see.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from vllm_blockfp8 import reference

GROUP = reference.BLOCK
PAIR = 2  # the kernel sends a pair to the division when either of its values needs it
FP8 = reference.FP8_DTYPE
FP8_MAX = reference.FP8_MAX
MIN_FAST = 2.0**-6  # kE4m3MinNormal: |p| below this (zeros, e4m3 subnormals) or NaN takes the division
F64_EXTRA = 29  # float64 fraction bits below fp32's 23
F64_MIDPOINT = 1 << (F64_EXTRA - 1)  # low 29 bits of a float64 that is halfway between two fp32


def two_sum(a: torch.Tensor, b: torch.Tensor):
    """(hi, lo) float64 with hi = RN64(a + b) and hi + lo == a + b exactly (Knuth's TwoSum)."""
    hi = a + b
    b_virtual = hi - a
    return hi, (a - (hi - b_virtual)) + (b - b_virtual)


def round_to_fp32(hi: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """RN32(hi + lo) for hi = RN64(hi + lo), one rounding from the exact sum: RN32(hi) unless hi is
    exactly halfway between two fp32 and lo != 0 (then the sum is past the tie, on lo's side; any
    other fp32 rounding boundary is a float64 too, so RN64 never crosses one). Valid for results 0
    or in fp32's normal range, which is every value the kernel keeps."""
    tie = ((hi.view(torch.int64) & ((1 << F64_EXTRA) - 1)) == F64_MIDPOINT) & (lo != 0)
    past = torch.nextafter(hi, torch.where(lo > 0, torch.inf, -torch.inf).to(hi.dtype))
    return torch.where(tie, past, hi).float()


def fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """__fmaf_rn on fp32 tensors (broadcasting): RN32(a b + c) from the exact a b + c. a b is exact
    in float64 (24 + 24 significant bits, far from its range limits); a b + c can need ~75 bits, so
    TwoSum keeps it exactly as hi + lo and round_to_fp32 rounds once."""
    return round_to_fp32(*two_sum(a.double() * b.double(), c.double()))


def fma32_double_rounded(a, b, c):
    """Negative control: the float64 sum rounded again to fp32 (two roundings)."""
    return (a.double() * b.double() + c.double()).float()


def group_view(x: torch.Tensor):
    """(x fp32 [M, N / 128, 128], scale fp32 [M, N / 128, 1]) as the kernel and the reference form them."""
    m, n = x.shape
    g = x.float().reshape(m, n // GROUP, GROUP)
    return g, g.abs().amax(dim=-1, keepdim=True).clamp_min(reference.AMAX_FLOOR) / FP8_MAX


def kernel_quotient(x: torch.Tensor, fma=fma32, correct: bool = True, rem_sign: float = 1.0):
    """quant_lane16_rcp's fp32 arithmetic per value of x [M, N], each [M, N]: p = RN(x r), Q (the
    value converted to e4m3), exact = RN(x / scale) (the reference's quotient) and fallback (took
    the division). correct=False skips the correction (Q = p), rem_sign=-1 flips rem: both only for
    the negative controls."""
    m, n = x.shape
    g, scale = group_view(x)
    r = torch.ones_like(scale) / scale  # __frcp_rn(scale)
    p = g * r  # __fmul_rn(x, r)
    q = fma(rem_sign * fma(-p, scale, g), r, p) if correct else p
    fast = p.abs() >= MIN_FAST  # false for NaN
    fast = fast.reshape(m, n // GROUP, GROUP // PAIR, PAIR).all(dim=-1, keepdim=True).expand(-1, -1, -1, PAIR)
    fast = fast.reshape(g.shape)
    exact = g / scale
    q = torch.where(fast, q, exact)
    return {"p": p.reshape(m, n), "q": q.reshape(m, n), "exact": exact.reshape(m, n), "fallback": ~fast.reshape(m, n)}


def to_fp8(q: torch.Tensor) -> torch.Tensor:
    """__nv_cvt_float2_to_fp8x2(..., __NV_SATFINITE, __NV_E4M3), as the reference converts."""
    return q.clamp(-FP8_MAX, FP8_MAX).to(FP8)


def mismatches(x: torch.Tensor, **kw) -> int:
    """fp8 codes that differ from the reference's."""
    q_ref, _ = reference.quantize_per_token_group(x)
    return int((to_fp8(kernel_quotient(x, **kw)["q"]).view(torch.uint8) != q_ref.view(torch.uint8)).sum())


def assert_bit_exact(x: torch.Tensor) -> dict:
    """The fp32 bits of every quotient and then the fp8 bytes and the scales match the reference's.
    Returns kernel_quotient(x)."""
    k = kernel_quotient(x)
    bad = (k["q"].view(torch.int32) != k["exact"].view(torch.int32)).nonzero()
    assert bad.numel() == 0, f"{bad.shape[0]} quotients differ, first at {bad[0].tolist()}: {x[tuple(bad[0])]!r}"
    q_ref, s_ref = reference.quantize_per_token_group(x)
    assert torch.equal(to_fp8(k["q"]).view(torch.uint8), q_ref.view(torch.uint8))
    assert torch.equal(group_view(x)[1].squeeze(-1).view(torch.int32), s_ref.view(torch.int32))
    return k


def groups(amax: torch.Tensor, values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[M, 128] groups of `dtype`: amax[i] first, then row i of values [len(amax), L] (|values| <=
    amax, padded with zeros to whole groups), so that every value is quantized with amax[i]."""
    n, length = values.shape
    per_group = GROUP - 1
    padded = torch.zeros(n, -(-length // per_group) * per_group, dtype=torch.float64)
    padded[:, :length] = values
    body = padded.reshape(-1, per_group)
    head = amax.to(torch.float64).repeat_interleave(body.shape[0] // n).unsqueeze(1)
    return torch.cat([head, body], dim=1).to(dtype)


def e4m3_midpoints() -> torch.Tensor:
    """The 118 rounding midpoints between consecutive normal e4m3 values, 2^-6 .. 448."""
    values = [(1 + j / 8) * 2.0**e for e in range(-6, 9) for j in range(8)]
    values = torch.tensor([v for v in values if v <= FP8_MAX], dtype=torch.float64)
    return (values[:-1] + values[1:]) / 2


def neighbours(x: torch.Tensor, steps) -> torch.Tensor:
    """x [N] (positive, any float dtype) moved by each of `steps` bit patterns: [N, len(steps)]."""
    bits = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}[x.dtype]
    base = x.view(bits).to(torch.int64).unsqueeze(1) + torch.tensor(steps)
    return base.to(bits).view(x.dtype).to(torch.float64)


def random_activations(dtype: torch.dtype, rows: int, cols: int, gen: torch.Generator) -> torch.Tensor:
    """Gaussian and heavy-tailed groups, each at its own magnitude, a few outliers per row."""
    lo, hi = (-30.0, 30.0) if dtype == torch.bfloat16 else (-10.0, 2.0)
    x = torch.randn(rows, cols, generator=gen)
    tails = torch.rand(rows, cols // GROUP, 1, generator=gen) < 0.3
    x = x.reshape(rows, -1, GROUP)
    x = torch.where(tails, x * torch.randn(x.shape, generator=gen).abs() ** 2, x)  # a scale mixture
    x = x * torch.exp2(torch.empty(rows, cols // GROUP, 1).uniform_(lo, hi, generator=gen))
    x = x.reshape(rows, cols)
    outliers = torch.randint(0, cols, (rows, 2), generator=gen)
    x.scatter_(1, outliers, x.gather(1, outliers) * 40)
    return x.to(dtype)


def adversarial_16bit(dtype: torch.dtype) -> torch.Tensor:
    """Midpoints times scales, rounded to `dtype`, with their neighbours 1 and 2 patterns away.

    Exact scales: amax = 7 c 2^e makes scale = c 2^(e-6) exact, so mid * scale is exact (or one
    16-bit rounding away) and x / scale lands on the midpoint: a tie, with p one pattern off
    whenever r = 1 / scale is inexact (c != 1). Random scales: any 16-bit amax."""
    gen = torch.Generator().manual_seed(2)
    exact = torch.tensor([7.0 * c for c in range(1, 16, 2)], dtype=torch.float64)
    exact = (exact[:, None] * torch.exp2(torch.arange(-3.0, 4.0))[None, :]).flatten()
    rand = torch.exp2(torch.empty(200).uniform_(-4, 4, generator=gen)).to(dtype).to(torch.float64)
    amax = torch.cat([exact, rand]).to(dtype).to(torch.float64)
    scale = (amax.float() / FP8_MAX).to(torch.float64)
    targets = (e4m3_midpoints()[None, :] * scale[:, None]).to(dtype)  # [A, 118]
    values = neighbours(targets.flatten(), [-2, -1, 0, 1, 2]).reshape(len(amax), -1)
    values = torch.minimum(values, amax[:, None])
    signs = torch.where(torch.rand(values.shape, generator=gen) < 0.5, -1.0, 1.0)
    return groups(amax, values * signs, dtype)


def significand_sweep(dtype: torch.dtype, deepest: int = 16) -> torch.Tensor:
    """Every (amax, x) pair of `dtype` significands, x / scale in every binade from 448 down to
    below 2^-6 (x = s 2^-k, k = 0..deepest, and x <= amax; deepest = 20 reaches below 2^-11); signs
    alternate."""
    n = 128 if dtype == torch.bfloat16 else 1024
    base = 1.0 if dtype == torch.bfloat16 else 2.0**14  # fp16: keep x normal down to k = 16
    sig = torch.arange(n, 2 * n, dtype=torch.float64) / n
    amax = sig * base
    values = torch.cat([torch.minimum(sig[None, :], sig[:, None]) * base] +
                       [sig[None, :].expand(n, n) * base * 2.0**-k for k in range(1, deepest + 1)], dim=1)
    signs = torch.where(torch.arange(values.shape[1]) % 2 == 0, 1.0, -1.0).to(torch.float64)
    return groups(amax, values * signs, dtype)


def ulps_off(k: dict, x: torch.Tensor) -> torch.Tensor:
    """|p - x / scale| in ulps of x / scale, per value: Markstein's theorem wants it below 1."""
    g, scale = group_view(x)
    p = k["p"].reshape(g.shape).abs().double()
    e = torch.floor(torch.log2(k["exact"].reshape(g.shape).abs().double().clamp_min(2.0**-126)))
    # p scale and p scale - x are exact in float64 (48-bit product; the difference is a multiple of
    # ulp(p) ulp(scale) below 2^26 of them)
    return ((p * scale.double() - g.abs().double()).abs() / (torch.exp2(e - 23) * scale.double())).reshape(x.shape)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_random_activations_bit_exact(dtype):
    x = random_activations(dtype, 2048, 2048, torch.Generator().manual_seed(1))  # 4.2M values
    assert torch.isfinite(x).all()
    fallback = assert_bit_exact(x)["fallback"]
    # A rule that sent everything to the division would pass the checks above: the fast path must
    # carry nearly all values. Fallbacks: |x / scale| < 2^-6 and the other value of its pair; this
    # set's heavy tails and 40x outliers put ~1.6% of values that far below their group's amax.
    rate = fallback.double().mean().item()
    print(f"random {dtype}: fallback {rate:.3%} of values")
    assert rate < 0.03, rate


def test_randn_bf16_fallback_rate():
    """The benchmark's input (randn activations): the division runs for ~0.016% of the values."""
    x = torch.randn(2048, 2048, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    rate = assert_bit_exact(x)["fallback"].double().mean().item()
    print(f"randn bf16: fallback {rate:.4%} of values")
    assert 0 < rate < 5e-4, rate


def e4m3_midpoint_distance(v: torch.Tensor) -> torch.Tensor:
    """fp32 bit patterns from v to the nearest pattern with low 20 bits 0x80000 (a normal e4m3 midpoint)."""
    low = (v.view(torch.int32).to(torch.int64) - 0x80000) & 0xFFFFF
    return torch.minimum(low, 0x100000 - low)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_midpoint_values_bit_exact(dtype):
    x = adversarial_16bit(dtype)
    k = assert_bit_exact(x)
    d = e4m3_midpoint_distance(k["exact"])
    ties = ~k["fallback"] & (d == 0)
    assert ties.sum() > 100, "the set must put x / scale exactly on e4m3 midpoints"
    assert (ties & (k["p"].view(torch.int32) != k["exact"].view(torch.int32))).any(), "with p one pattern off"
    assert (~k["fallback"] & (d > 0) & (d < 1 << 16)).sum() > 1000, "and their 16-bit neighbours just off them"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_every_16bit_significand_pair_bit_exact(dtype):
    x = significand_sweep(dtype)
    k = assert_bit_exact(x)
    off = ulps_off(k, x)[~k["fallback"]]
    # Markstein's theorem assumes p within 1 ulp of x / scale; RN(x RN(1 / scale)) is not always, and
    # the sweep holds such values (all exact above): the sequence is CUDA's own div.rn fast path.
    print(f"sweep {dtype}: {x.numel()} values, p more than 1 ulp from x / scale for "
          f"{(off > 1).double().mean().item():.3%} of fast ones (max {off.max().item():.3f} ulp)")
    assert off.max() < 1.5 and (off > 1).any(), off.max()


def below_floor_groups() -> torch.Tensor:
    """Every positive and negative bf16 value under 1e-10 (scale = RN(1e-10 / 448), the one scale
    that does not scale with amax), in groups whose amax is under the floor too."""
    bits = torch.arange(0, 0x2F80, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    v = bits[bits.float() < reference.AMAX_FLOOR]
    v = torch.cat([v, -v])
    return torch.cat([v, torch.zeros(-len(v) % GROUP, dtype=torch.bfloat16)]).reshape(-1, GROUP)


def test_bf16_below_the_amax_floor_bit_exact():
    v = below_floor_groups()
    assert (v.float().abs().amax(dim=1) < reference.AMAX_FLOOR).all()
    assert (~assert_bit_exact(v)["fallback"]).sum() > 1000, "values above 2^-6 scale must take the fast path"


def edge_groups(dtype: torch.dtype) -> torch.Tensor:
    """Signed zeros, e4m3-subnormal quotients, values at 448, the type's extremes and (bf16) fp32
    subnormals and groups under the amax floor, one group a row."""
    gen = torch.Generator().manual_seed(4)
    info = torch.finfo(dtype)
    one = torch.ones(GROUP)
    rows = [
        torch.zeros(GROUP), -torch.zeros(GROUP),  # all-zero groups: scale = 1e-10 / 448
        torch.cat([one[:1], torch.zeros(63), -torch.zeros(64)]),  # signed zeros beside an amax
        torch.cat([-one[:1], -torch.zeros(1), one[1:64], -torch.zeros(63)]),  # -0 paired with a fast value
        # x / scale in the e4m3 subnormal range and across 2^-6, and a few at 448 = amax
        torch.cat([one[:2], torch.empty(126).uniform_(-2.0**-13, 2.0**-13, generator=gen)]),
        torch.cat([-one[:1], torch.linspace(0, 2.0**-12, 127)]),
        torch.cat([one[:1], 1 - torch.arange(1, 64) * info.eps, -(1 - torch.arange(64) * info.eps)]),
        torch.full((GROUP,), info.max) * torch.where(torch.rand(GROUP, generator=gen) < 0.5, -1.0, 1.0),
        torch.linspace(-1, 1, GROUP) * info.max,
        torch.linspace(info.tiny, 2 * info.tiny, GROUP),
        torch.linspace(-info.smallest_normal, info.smallest_normal, GROUP),
    ]
    if dtype == torch.bfloat16:  # around the amax floor, and bf16 subnormals (fp32 subnormals)
        rows += [torch.empty(GROUP).uniform_(-1e-10, 1e-10, generator=gen),
                 torch.exp2(torch.empty(GROUP).uniform_(-45, -33.3, generator=gen)),
                 torch.cat([torch.full((1,), 1.0001e-10), torch.empty(127).uniform_(-1e-10, 1e-10, generator=gen)]),
                 torch.cat([one[:1] * 2.0**-110, torch.linspace(-2.0**-126, 2.0**-126, 127)])]
    return torch.stack(rows).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_edge_values_bit_exact(dtype):
    x = edge_groups(dtype)
    assert torch.isfinite(x).all()
    k = assert_bit_exact(x)
    p = k["p"]
    assert k["fallback"][p.abs() < MIN_FAST].all(), "zeros, e4m3-subnormal quotients, fp32 subnormals: division"
    assert ((p.abs() < MIN_FAST) & (p != 0)).any() and (p.abs() > FP8_MAX - 1).any()
    neg_zero = (x == 0) & torch.signbit(x.float())
    q8 = to_fp8(k["q"]).view(torch.uint8)
    assert neg_zero.any() and (q8[neg_zero] == 0x80).all(), "-0 keeps its sign (the FMAs would give +0)"


def test_fp32_inputs_bit_exact():
    """Not a kernel input type: x and amax with 24-bit significands, where p is up to 1.5 ulp off and
    rem = x - p scale can need 25 bits (then the first FMA rounds). Q is still RN(x / scale)."""
    gen = torch.Generator().manual_seed(3)
    magnitude = torch.exp2(torch.empty(1024, 8, 1).uniform_(-20, 20, generator=gen))
    x = (torch.randn(1024, 8, GROUP, generator=gen) * magnitude).reshape(1024, -1)
    assert_bit_exact(x)
    amax = torch.exp2(torch.empty(400).uniform_(-8, 8, generator=gen)).float()
    targets = (e4m3_midpoints().float()[None, :] * (amax / FP8_MAX)[:, None]).flatten()
    values = neighbours(targets, list(range(-8, 9))).reshape(len(amax), -1)
    assert_bit_exact(groups(amax, torch.minimum(values, amax.to(torch.float64)[:, None]), torch.float32))


def fma_exact(a: float, b: float, c: float) -> float:
    """RN32(a b + c) with Fractions, the reference for fma32."""
    v = Fraction(a) * Fraction(b) + Fraction(c)
    if v == 0:
        return 0.0
    ulp = Fraction(2) ** (v.numerator.bit_length() - v.denominator.bit_length() - 25)
    while abs(v) >= ulp * 2**24:
        ulp *= 2
    while abs(v) < ulp * 2**23:
        ulp /= 2
    n, rest = divmod(abs(v) / ulp, 1)
    n += rest > Fraction(1, 2) or (rest == Fraction(1, 2) and n % 2 == 1)
    return float(n * ulp) * (1 if v > 0 else -1)


def test_fma_emulation_rounds_once():
    """fma32 against Fractions on random triples, near-cancelling triples (the rem step) and triples
    whose float64 sum lands exactly on an fp32 tie (where rounding twice goes wrong)."""
    gen = torch.Generator().manual_seed(7)
    a = torch.randn(3000, generator=gen) * torch.exp2(torch.randint(-20, 20, (3000,), generator=gen).float())
    b = torch.randn(3000, generator=gen)
    c = torch.randn(3000, generator=gen)
    c[:1000] = -(a[:1000].double() * b[:1000].double()).float()  # a b + c cancels
    # (1 + 2^-23)(1 - 2^-23) 2^-24 + (1 + 2^-23) = 1 + 3 2^-24 - 2^-70: float64 rounds it onto the tie
    # between 1 + 2^-23 and 1 + 2^-22, and fp32 then rounds the tie to even: one pattern high.
    hard = torch.tensor([[1 + 2.0**-23, (1 - 2.0**-23) * 2.0**-24, 1 + 2.0**-23],
                         [1 + 2.0**-23, (1 + 2.0**-23) * 2.0**-24, 1.0],
                         [-(1 + 2.0**-23), (1 - 2.0**-23) * 2.0**-24, -(1 + 2.0**-23)]], dtype=torch.float32)
    a, b, c = (torch.cat([t, hard[:, i]]) for i, t in enumerate((a, b, c)))
    want = torch.tensor([fma_exact(*abc) for abc in zip(a.tolist(), b.tolist(), c.tolist())], dtype=torch.float32)
    assert torch.equal(fma32(a, b, c).view(torch.int32), want.view(torch.int32))
    twice = fma32_double_rounded(a, b, c)
    assert (twice.view(torch.int32) != want.view(torch.int32))[-3:].tolist() == [True, False, True]


def test_the_checks_can_fail():
    """Without the correction (Q = p) ties whose p is one pattern off round to p's side; with rem's
    sign flipped the step moves away from x / scale; both give wrong bytes on the midpoint set."""
    x = adversarial_16bit(torch.bfloat16)
    assert mismatches(x) == 0
    assert mismatches(x, correct=False) > 100
    assert mismatches(x, rem_sign=-1.0) > 100


# The branch-free form (dev/probes/narrow_fused_quant_probe.cu, exact_quotient_branchless): Q for every value, then p
# itself where |p| < 2^-11. Below 2^-10 every quotient converts to e4m3 +-0 (the smallest subnormal is 2^-9), and p has
# x's sign, so the select keeps -0, fp32-subnormal x and e4m3-zero quotients exact without the division; between 2^-11
# and 2^-6 (e4m3 subnormals) Q must equal RN(x / scale), which the deeper sweep checks. A kernel that quantizes inside a
# latency-bound loop pays for the division's branch (3.5x the conversion's time in the probe: gemm/NOTES.md).
E4M3_ZERO = 2.0**-11


def branchless_quotient(x: torch.Tensor, select: bool = True, zero_below: float = E4M3_ZERO) -> dict:
    """The branch-free quotient per value of x [M, N]: p, q (converted to e4m3) and exact = RN(x / scale).
    select=False keeps Q everywhere, zero_below moves the select's threshold (both negative controls)."""
    m, n = x.shape
    g, scale = group_view(x)
    r = torch.ones_like(scale) / scale
    p = g * r
    q = fma32(fma32(-p, scale, g), r, p)
    if select:
        q = torch.where(p.abs() < zero_below, p, q)
    return {"p": p.reshape(m, n), "q": q.reshape(m, n), "exact": (g / scale).reshape(m, n)}


def assert_branchless_exact(x: torch.Tensor) -> dict:
    """Q's fp32 bits equal RN(x / scale) wherever |p| >= 2^-11, and every fp8 byte equals the reference's."""
    k = branchless_quotient(x)
    kept = k["p"].abs() >= E4M3_ZERO
    bad = (kept & (k["q"].view(torch.int32) != k["exact"].view(torch.int32))).nonzero()
    assert bad.numel() == 0, f"{bad.shape[0]} quotients differ, first at {bad[0].tolist()}: {x[tuple(bad[0])]!r}"
    q_ref, _ = reference.quantize_per_token_group(x)
    assert torch.equal(to_fp8(k["q"]).view(torch.uint8), q_ref.view(torch.uint8))
    return k


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_branchless_every_16bit_significand_pair(dtype):
    x = significand_sweep(dtype, deepest=20)
    k = assert_branchless_exact(x)
    subnormal = (k["p"].abs() >= E4M3_ZERO) & (k["p"].abs() < MIN_FAST)
    assert subnormal.sum() > 10000, "the sweep must reach the e4m3-subnormal quotients through Q"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_branchless_edges_midpoints_and_random(dtype):
    assert_branchless_exact(edge_groups(dtype))
    assert_branchless_exact(adversarial_16bit(dtype))
    assert_branchless_exact(random_activations(dtype, 512, 2048, torch.Generator().manual_seed(8)))
    if dtype == torch.bfloat16:
        assert_branchless_exact(below_floor_groups())


def test_branchless_select_is_needed_and_bounded():
    """Q alone turns -0 into +0 (and is not RN(x / scale) for fp32-subnormal x); p taken up to 2^-7 instead of 2^-11
    misses e4m3-subnormal roundings the sweep holds. Either way the bytes differ."""
    for x, kw in ((edge_groups(torch.bfloat16), {"select": False}),
                  (significand_sweep(torch.bfloat16, deepest=20), {"zero_below": 2.0**-7})):
        q_ref, _ = reference.quantize_per_token_group(x)
        got = to_fp8(branchless_quotient(x, **kw)["q"]).view(torch.uint8)
        assert (got != q_ref.view(torch.uint8)).sum() > 0, kw
