"""The paired NVFP4 packing (reference.pair_nvfp4_weight, ops.pair_nvfp4_weight): the bit permutation checked bit
by bit against its definition (reference.NVFP4_PAIRED_BITS), its inverse, the decode formulas the CUDA kernels rely
on (csrc/fp4/decode.cuh: one shift and one mask per pair of values), and nvfp4_linear(..., b_paired=True) against the
ModelOpt call. On CPU, and the same on CUDA where a GPU is present.
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
# ops.pair_nvfp4_weight's validation and nvfp4_linear(..., b_paired=True)
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
def test_linear_on_paired_weight_equals_the_modelopt_call_on_cpu(dtype):
    """The reference backend unpairs b first: the same numbers, bit for bit."""
    g = torch.Generator().manual_seed(4)
    n, k = 96, 512
    packed, scale, gs = reference.quantize_nvfp4(torch.randn(n, k, generator=g))
    paired = ops.pair_nvfp4_weight(packed)
    per_row = (gs * torch.linspace(0.5, 2.0, n)).contiguous()
    bias = torch.randn(n, generator=g).to(dtype)
    for m in (1, 17):
        x = torch.randn(2, m, k, generator=g).to(dtype)
        for args in ((gs.reshape(1),), (per_row, bias)):
            want = ops.nvfp4_linear(x, packed, scale, *args)
            got = ops.nvfp4_linear(x, paired, scale, *args, b_paired=True)
            assert got.dtype == dtype and torch.equal(got, want)


def test_native_with_paired_weight_raises():
    """The native W4A4 GEMM (CUTLASS) reads the checkpoint packing."""
    packed, scale, gs = reference.quantize_nvfp4(torch.randn(64, 256, generator=torch.Generator().manual_seed(5)))
    x = torch.randn(3, 256).to(torch.bfloat16)
    native = ops.nvfp4_native_operands(scale, torch.ones(1), gs.reshape(1))
    with pytest.raises(ValueError, match=r"^native and b_paired=True"):
        ops.nvfp4_linear(x, ops.pair_nvfp4_weight(packed), scale, gs.reshape(1), native=native, b_paired=True)
    ops.nvfp4_linear(x, packed, scale, gs.reshape(1), native=native)  # the checkpoint packing goes


@needs_kernels()
@pytest.mark.parametrize("m", (1, 16, 64))
def test_linear_on_paired_weight_on_cuda(m):
    """The kernels on the paired packing against the float64 reference of the ModelOpt weight (their summation
    order may differ from the ModelOpt call's, so the bound, not equality; tests/test_fp4.py covers every row)."""
    g = torch.Generator(device="cuda").manual_seed(6)
    n, k = 520, 1024
    packed, scale, gs = reference.quantize_nvfp4(torch.randn(n, k, device="cuda", generator=g))
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    out = ops.nvfp4_linear(x, ops.pair_nvfp4_weight(packed), scale, gs.reshape(1), b_paired=True)
    reference.assert_close_to_ref(out, reference.nvfp4_linear_ref(x, packed, scale, gs.reshape(1)), f"paired M={m}")
