"""The NVFP4 weight packings the kernels read. The paired one (reference.pair_nvfp4_weight, ops.pair_nvfp4_weight):
the bit permutation checked bit by bit against its definition (reference.NVFP4_PAIRED_BITS), its inverse, the decode
formulas the CUDA kernels rely on (csrc/fp4/decode.cuh: one shift and one mask per pair of values). The fragment one
(reference.fragment_nvfp4_weight, ops.fragment_nvfp4_weight): every code's position against the mma A fragment it
must land in, exp8 scales exact for every e4m3 value and the bit formulas csrc/fp4/fragment.cuh uses, zero-scale
groups, its inverse. And nvfp4_linear(..., packing=...) against the ModelOpt call. On CPU, and the same on CUDA where
a GPU is present.
"""

from __future__ import annotations

import pytest
import torch
from conftest import needs_kernels

from vllm_blockfp8 import ops, reference

# The permutation is plain torch ops: it runs on any CUDA device (no extension needed).
DEVICES = ("cpu", pytest.param("cuda", marks=needs_kernels(extension=False)))
# The paired word's rotation per pair for pairs 0-2, and the mask that keeps two bf16 lanes' e2m1 bits.
PAIR_ROTATIONS = (6, 2, 28)
LANE_MASK = 0x81C081C0


def _paired_word_by_definition(word: int) -> int:
    """Element e's bit i of the ModelOpt word (bit 4e + i) goes to bit NVFP4_PAIRED_BITS[e][i]."""
    out = 0
    for element, bits in enumerate(reference.NVFP4_PAIRED_BITS):
        for i, dst in enumerate(bits):
            out |= ((word >> (4 * element + i)) & 1) << dst
    return out


def _to_bytes(words: list, device="cpu") -> torch.Tensor:
    """Little-endian words as a packed weight [len(words), 4], one word per row, built byte by byte so the test
    does not lean on the host's byte order."""
    rows = [[(w >> (8 * j)) & 0xFF for j in range(4)] for w in words]
    return torch.tensor(rows, dtype=torch.uint8, device=device)


def _from_bytes(b: torch.Tensor) -> list:
    return [sum(byte << (8 * j) for j, byte in enumerate(row)) for row in b.cpu().tolist()]


def _rotl(word: int, r: int) -> int:
    return ((word << r) | (word >> (32 - r))) & 0xFFFFFFFF if r else word


def _lane_bits(code: int) -> int:
    """A code's bf16 operand bits in a 16-bit lane: mantissa at 6, exponent at 7-8, sign at 15."""
    return ((code & 7) << 6) | ((code >> 3) << 15)


def _decode_pair(paired: int, j: int) -> int:
    """The decode of pair j (elements 2j, 2j + 1) as the reference comment states it."""
    if j < 3:
        return _rotl(paired, PAIR_ROTATIONS[j]) & LANE_MASK
    return (paired & 0x81808180) | ((paired >> 8) & 0x00400040)


def _random_words(count: int, seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    return [int(w) for w in torch.randint(0, 1 << 32, (count,), generator=g, dtype=torch.int64)]


# --------------------------------------------------------------------------------------------
# The permutation
# --------------------------------------------------------------------------------------------


def test_paired_bits_are_a_permutation_of_the_word():
    flat = [bit for bits in reference.NVFP4_PAIRED_BITS for bit in bits]
    assert sorted(flat) == list(range(32))


@pytest.mark.parametrize("device", DEVICES)
def test_every_code_at_every_element_moves_bit_by_bit(device):
    """Each code 0..15 alone at each element position, then over a background of 0xF codes (so a bit that leaks
    into a neighbour's place shows), then random words."""
    words = [code << (4 * e) for e in range(8) for code in range(16)]
    background = 0xFFFFFFFF
    words += [(background & ~(0xF << (4 * e))) | (code << (4 * e)) for e in range(8) for code in range(16)]
    words += _random_words(4096, seed=0) + [0, 0xFFFFFFFF, 0x80000000, 1]
    paired = reference.pair_nvfp4_weight(_to_bytes(words, device))
    assert paired.device.type == device and paired.dtype == torch.uint8 and paired.shape == (len(words), 4)
    got = _from_bytes(paired)
    for word, have in zip(words, got):
        assert have == _paired_word_by_definition(word), f"word {word:#010x}: paired {have:#010x}"


@pytest.mark.parametrize("device", DEVICES)
def test_each_word_of_a_row_is_permuted_on_its_own(device):
    """A weight row of many words: each aligned 32-bit word pairs by itself (no bit crosses a word)."""
    words = _random_words(8 * 64, seed=1)
    b = _to_bytes(words, device).reshape(8, 256)
    got = _from_bytes(reference.pair_nvfp4_weight(b).reshape(-1, 4))
    assert got == [_paired_word_by_definition(w) for w in words]


@pytest.mark.parametrize("device", DEVICES)
def test_round_trip(device):
    g = torch.Generator().manual_seed(2)
    b = torch.randint(0, 256, (300, 528), generator=g, dtype=torch.uint8).to(device)
    paired = ops.pair_nvfp4_weight(b)
    assert paired.shape == b.shape and paired.dtype == torch.uint8 and paired.is_contiguous()
    assert not torch.equal(paired, b)
    assert torch.equal(reference.unpair_nvfp4_weight(paired), b)
    assert torch.equal(reference.pair_nvfp4_weight(reference.unpair_nvfp4_weight(b)), b)
    if device != "cpu":  # the device computes the same bytes as the host
        assert torch.equal(paired.cpu(), reference.pair_nvfp4_weight(b.cpu()))


@pytest.mark.parametrize("device", DEVICES)
def test_dequantize_after_the_round_trip_is_unchanged(device):
    w = torch.randn(96, 512, generator=torch.Generator().manual_seed(3)).to(device)
    packed, scale, gs = reference.quantize_nvfp4(w)
    back = reference.unpair_nvfp4_weight(ops.pair_nvfp4_weight(packed))
    assert torch.equal(reference.dequantize_nvfp4(back, scale, gs), reference.dequantize_nvfp4(packed, scale, gs))


# --------------------------------------------------------------------------------------------
# The decode contract (what csrc/fp4/decode.cuh computes from a paired word)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pair", range(4))
def test_decode_formulas_give_both_lanes_bf16_operand_bits(pair):
    """For every (low, high) code pair at pair j, over backgrounds of 0, 0xF and random codes in the other six
    elements: pair j's shift and mask leave element 2j's code at bits 6, 7-8, 15 and element 2j + 1's at 22, 23-24,
    31, and nothing of the other elements."""
    backgrounds = [0, 0xFFFFFFFF] + _random_words(6, seed=10 + pair)
    lo_shift, hi_shift = 8 * pair, 8 * pair + 4
    keep = ~(0xFF << lo_shift) & 0xFFFFFFFF
    words, want = [], []
    for background in backgrounds:
        for lo in range(16):
            for hi in range(16):
                words.append((background & keep) | (lo << lo_shift) | (hi << hi_shift))
                want.append(_lane_bits(lo) | (_lane_bits(hi) << 16))
    got = [_decode_pair(p, pair) for p in _from_bytes(reference.pair_nvfp4_weight(_to_bytes(words)))]
    for word, g, w in zip(words, got, want):
        assert g == w, f"pair {pair}, word {word:#010x}: decoded {g:#010x}, expected {w:#010x}"


def test_lane_bits_are_e2m1_times_2_to_the_minus_126_in_bf16():
    """The lanes' meaning: a code's bits read as bf16 are its e2m1 value times 2^-126 (one multiply restores it)."""
    codes = torch.arange(16, dtype=torch.uint8)
    lanes = torch.tensor([_lane_bits(c) for c in range(16)], dtype=torch.int32)
    as_bf16 = torch.where(lanes >= 1 << 15, lanes - (1 << 16), lanes).to(torch.int16).view(torch.bfloat16)
    assert torch.equal(as_bf16.float() * 2.0**126, reference.e2m1_decode(codes))


# --------------------------------------------------------------------------------------------
# The fragment packing (csrc/fp4/fragment.cuh)
# --------------------------------------------------------------------------------------------


def _fragment_position(n: int, k: int, row: int, col: int) -> tuple:
    """(byte offset of the 32-bit word, element 0-7 in it) where the fragment packing must put code (row, col): the
    mma A fragment of lane (g, t) for k16 step kk of 16-row tile T and 64-deep stage S is (row g, k 2t, 2t + 1),
    (g + 8, 2t, 2t + 1), (g, 2t + 8, 2t + 9), (g + 8, 2t + 8, 2t + 9) (csrc/fp4/sm90/wgmma.cuh)."""
    tile, r = divmod(row, 16)
    stage, kc = divmod(col, 64)
    kk, kr = divmod(kc, 16)
    g, half = r % 8, r // 8
    hi, rest = divmod(kr, 8)
    t, j = divmod(rest, 2)
    word = ((tile * (k // 64) + stage) * 32 + 4 * g + t) * 16 + 4 * kk
    return word, 4 * hi + 2 * half + j


@pytest.mark.parametrize("device", DEVICES)
def test_fragment_packing_puts_every_code_in_its_fragment(device):
    """Each code, made unique by its position, lands where the A fragment needs it, in the paired bit order."""
    n, k = 32, 192
    g = torch.Generator().manual_seed(7)
    codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(device)
    scale = (torch.rand(n, k // 16, generator=g) * 100 + 0.01).to(reference.FP8_DTYPE).to(device)
    frag, _ = reference.fragment_nvfp4_weight(packed, scale)
    words = reference.unpair_nvfp4_weight(frag.reshape(-1, 4)).reshape(-1).cpu()  # element e in nibble e
    for row in range(n):
        for col in range(k):
            word, element = _fragment_position(n, k, row, col)
            got = (int(words[word + element // 2]) >> (4 * (element % 2))) & 0xF
            assert got == int(codes[row, col]), f"code ({row}, {col})"


@pytest.mark.parametrize("device", DEVICES)
def test_exp8_is_exact_for_every_e4m3_scale_and_matches_the_kernel_formulas(device):
    """exp8 holds every positive e4m3 value exactly; the kernels' bit formulas (fragment.cuh exp8_pair) give the
    bf16 bits of scale * 2^119 and the f16 bits of scale * 2^7 from the byte."""
    scales = torch.arange(1, 127, dtype=torch.uint8).view(reference.FP8_DTYPE).to(device)
    e8 = reference.exp8_scales(scales)
    assert torch.equal(reference.exp8_decode(e8), scales.float())
    as_int = e8.cpu().to(torch.int32)
    bf16 = ((as_int << 4) + 0x7680).to(torch.int16).view(torch.bfloat16).float()
    assert torch.equal(bf16, scales.cpu().float() * 2.0**119)
    f16 = ((as_int << 7) + 0x3400).to(torch.int16).view(torch.float16).float()
    assert torch.equal(f16, scales.cpu().float() * 2.0**7)
    assert reference.exp8_scales(torch.zeros(3, dtype=reference.FP8_DTYPE)).tolist() == [0, 0, 0]


def test_fragment_packing_scales_zero_groups_and_round_trip():
    g = torch.Generator().manual_seed(8)
    n, k = 48, 256
    packed, scale, gs = reference.quantize_nvfp4(torch.randn(n, k, generator=g))
    scale.view(torch.uint8)[::5, ::3] = 0  # zero-scale groups: their codes are zeroed, their byte is 0
    frag, e8 = ops.fragment_nvfp4_weight(packed, scale)
    assert frag.shape == packed.shape and frag.dtype == torch.uint8
    assert e8.shape == scale.shape and e8.dtype == torch.uint8
    back, back_scale = reference.unfragment_nvfp4_weight(frag, e8)
    want = reference.dequantize_nvfp4(packed, scale, gs)
    assert torch.equal(reference.dequantize_nvfp4(back, back_scale, gs), want)
    # Scale bytes: lane group g's 8 at (block * 64 + 8 g): row g's steps 0-3, then row g + 8's.
    e8_plain = reference.exp8_scales(scale)
    block, g_, half, kk = 1 * (k // 64) + 2, 5, 1, 3  # tile 1, stage 2
    assert int(e8.reshape(-1)[block * 64 + 8 * g_ + 4 * half + kk]) == int(e8_plain[16 + g_ + 8 * half, 4 * 2 + kk])


def test_fragment_packing_refuses_what_it_cannot_hold():
    packed, scale, _ = reference.quantize_nvfp4(torch.randn(32, 128, generator=torch.Generator().manual_seed(9)))
    cases = {
        "N % 16": ((packed[:24], scale[:24]), r"N = 24 is not a multiple of 16"),
        "K % 64": ((packed[:, :48].contiguous(), scale[:, :6].contiguous()), r"K = 96 is not a multiple of 64"),
        "scale dtype": ((packed, scale.float()), r"^b_scale must be float8_e4m3fn"),
        "negative scale": ((packed, (-scale.float().abs()).to(reference.FP8_DTYPE)), r"non-negative, finite"),
    }
    for what, (args, pattern) in cases.items():
        with pytest.raises(ValueError, match=pattern):
            ops.fragment_nvfp4_weight(*args)
            pytest.fail(what)


def test_layer_packing_without_a_gpu_is_paired():
    """The reference backend reads any packing; without the SM90 kernels the layer keeps the paired one."""
    assert ops.nvfp4_layer_packing(4096, 4096, "cpu") == "paired"
    packed, scale, _ = reference.quantize_nvfp4(torch.randn(32, 128, generator=torch.Generator().manual_seed(10)))
    b, b_scale, packing = ops.nvfp4_layer_weight(packed, scale)
    assert packing == "paired" and torch.equal(b, ops.pair_nvfp4_weight(packed)) and b_scale is scale


# --------------------------------------------------------------------------------------------
# ops.pair_nvfp4_weight's validation and nvfp4_linear(..., packing=...)
# --------------------------------------------------------------------------------------------


def test_bad_inputs_raise_value_error():
    good = torch.zeros(8, 32, dtype=torch.uint8)
    cases = {
        "not a tensor": ([[0] * 32], r"^b must be uint8"),
        "dtype": (good.view(torch.int8), r"^b must be uint8"),
        "1-D": (good.reshape(-1), r"^b must be uint8"),
        "3-D": (good.reshape(2, 4, 32), r"^b must be uint8"),
        "non-contiguous": (torch.zeros(8, 64, dtype=torch.uint8)[:, :32], r"^b must be contiguous"),
        "K % 32": (torch.zeros(8, 24, dtype=torch.uint8), r"^b must have K/2 columns with K % 32 == 0"),
    }
    for what, (b, pattern) in cases.items():
        with pytest.raises(ValueError, match=pattern):
            ops.pair_nvfp4_weight(b)
            pytest.fail(what)


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=str)
def test_linear_on_repacked_weight_equals_the_modelopt_call_on_cpu(dtype):
    """The reference backend unpacks the paired and fragment packings first: the same numbers, bit for bit."""
    g = torch.Generator().manual_seed(4)
    n, k = 96, 512
    packed, scale, gs = reference.quantize_nvfp4(torch.randn(n, k, generator=g))
    repacked = {"paired": (ops.pair_nvfp4_weight(packed), scale), "fragment": ops.fragment_nvfp4_weight(packed, scale)}
    per_row = (gs * torch.linspace(0.5, 2.0, n)).contiguous()
    bias = torch.randn(n, generator=g).to(dtype)
    for m in (1, 17):
        x = torch.randn(2, m, k, generator=g).to(dtype)
        for args in ((gs.reshape(1),), (per_row, bias)):
            want = ops.nvfp4_linear(x, packed, scale, *args)
            for packing, (b, b_scale) in repacked.items():
                got = ops.nvfp4_linear(x, b, b_scale, *args, packing=packing)
                assert got.dtype == dtype and torch.equal(got, want), packing


def test_native_with_paired_weight_raises():
    """The native W4A4 GEMM (CUTLASS) reads the checkpoint packing."""
    packed, scale, gs = reference.quantize_nvfp4(torch.randn(64, 256, generator=torch.Generator().manual_seed(5)))
    x = torch.randn(3, 256).to(torch.bfloat16)
    native = ops.nvfp4_native_operands(scale, torch.ones(1), gs.reshape(1))
    with pytest.raises(ValueError, match=r"^native needs packing='modelopt'"):
        ops.nvfp4_linear(x, ops.pair_nvfp4_weight(packed), scale, gs.reshape(1), native=native, packing="paired")
    ops.nvfp4_linear(x, packed, scale, gs.reshape(1), native=native)  # the checkpoint packing goes


@needs_kernels()
@pytest.mark.parametrize("m", (1, 16, 64))
def test_linear_on_repacked_weight_on_cuda(m):
    """The kernels on the paired and fragment packings against the float64 reference of the ModelOpt weight (their
    summation order may differ from the ModelOpt call's, so the bound, not equality; tests/test_fp4.py covers every
    row)."""
    g = torch.Generator(device="cuda").manual_seed(6)
    n, k = 528, 1024  # ragged against 128-row tiles; the fragment packing needs N % 16
    packed, scale, gs = reference.quantize_nvfp4(torch.randn(n, k, device="cuda", generator=g))
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    want = reference.nvfp4_linear_ref(x, packed, scale, gs.reshape(1))
    out = ops.nvfp4_linear(x, ops.pair_nvfp4_weight(packed), scale, gs.reshape(1), packing="paired")
    reference.assert_close_to_ref(out, want, f"paired M={m}")
    out = ops.nvfp4_linear(x, *ops.fragment_nvfp4_weight(packed, scale), gs.reshape(1), packing="fragment")
    reference.assert_close_to_ref(out, want, f"fragment M={m}")


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=str)
def test_weight_rounding_row_tolerance_is_needed_and_still_catches_a_wrong_group(dtype):
    """The dequantize row's numerics emulated on CPU (weight times global scale rounded to x's type, fp32 product,
    output rounded, bias added and rounded again): reference.assert_nvfp4_row_close accepts it for that row, the
    one-rounding bound of the other rows does not, and one 16-value group with a doubled scale fails it."""
    row = reference.NVFP4_WEIGHT_ROUNDING_ROWS[0]
    g = torch.Generator().manual_seed(7)
    m, n, k = 64, 256, 4096
    packed, scale, gs = reference.quantize_nvfp4(torch.randn(n, k, generator=g))
    per_row = (gs * torch.linspace(0.5, 2.0, n)).contiguous()
    x = torch.randn(m, k, generator=g).to(dtype)
    bias = torch.randn(n, generator=g).to(dtype)

    def emulate(s):
        w = reference.dequantize_nvfp4(packed, s, per_row.reshape(-1, 1)).to(dtype)
        return ((x.float() @ w.float().t()).to(dtype).float() + bias.float()).to(dtype)

    out = emulate(scale)
    reference.assert_nvfp4_row_close(out, x, packed, scale, per_row, bias, row, "emulated dequantize row")
    with pytest.raises(AssertionError):
        reference.assert_nvfp4_row_close(out, x, packed, scale, per_row, bias, None, "one rounding")
    wrong = scale.clone()
    wrong[3, 17] = (wrong[3, 17].float() * 2).to(wrong.dtype)
    with pytest.raises(AssertionError):
        reference.assert_nvfp4_row_close(emulate(wrong), x, packed, scale, per_row, bias, row, "a doubled group")
