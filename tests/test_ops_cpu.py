"""vllm_blockfp8.ops on CPU tensors: the wrappers, validation, fakes and compile path that the GPU
uses, run against the reference; plus self-checks of the reference quantizers from first principles.
"""

from __future__ import annotations

import math

import pytest
import torch

from vllm_blockfp8 import ops, reference, shapes

FP8 = torch.float8_e4m3fn
DTYPES = (torch.bfloat16, torch.float16)
# torch.library.opcheck's test_schema / test_autograd_registration compare the op's inputs before
# and after the call with torch.allclose, which has no CPU kernel for float8_e4m3fn; ops whose
# inputs include fp8 tensors therefore run the fake-tensor and dynamic-shape AOT checks only.
FP8_OPCHECK = ("test_faketensor", "test_aot_dispatch_dynamic")


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _activations(m, k, dtype, gen, special=True):
    """Random normal rows, with a huge group, a tiny group and an all-zero group when K allows."""
    x = torch.randn(m, k, generator=gen)
    if special and k >= 3 * 128:
        # Huge: amax near the dtype's max (finite). Tiny: fp16 subnormals, or for bf16 a group
        # below the reference's amax floor (1e-10), which quantizes to zeros by contract.
        big, tiny = (6.0e4, 1.0e-4) if dtype == torch.float16 else (1.0e30, 1.0e-30)
        x[0, :128] *= big / x[0, :128].abs().max()
        x[-1, 128:256] *= tiny
        x[m // 2, 256:384] = 0.0
    return x.to(dtype)


def _weight(n, k, gen):
    w = torch.randn(n, k, generator=gen) * torch.exp(torch.randn(n, 1, generator=gen))
    return reference.quantize_block_fp8(w)


def _bits(t):
    return t.contiguous().view(torch.uint8 if t.element_size() == 1 else torch.int32)


def assert_bits_equal(got, want, what):
    assert got.dtype == want.dtype and got.shape == want.shape, f"{what}: {got.dtype}{tuple(got.shape)}"
    bad = reference.first_mismatch(_bits(got), _bits(want))
    assert bad is None, f"{what}: first mismatch at {bad}"


def test_first_mismatch_finds_a_difference_in_any_rank():
    """The bit-exact checks' helper: a coordinate (or [] for a 0-dim tensor, e.g. NVFP4's global scale)
    where the bits differ, None only where none does; -0.0 and 0.0 differ."""
    a = torch.zeros(3, 4)
    assert reference.first_mismatch(a, a.clone()) is None
    b = a.clone()
    b[2, 1] = -0.0
    assert reference.first_mismatch(a, b) == [2, 1]
    assert reference.first_mismatch(torch.tensor(1.5), torch.tensor(1.5)) is None
    assert reference.first_mismatch(torch.tensor(1.5), torch.tensor(1.25)) == []


# ---------------------------------------------------------------------------------------------
# per_token_group_quant
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k", [(1, 128), (3, 512), (7, 384), (83, 1024)])
def test_quant_bit_exact(m, k, dtype):
    x = _activations(m, k, dtype, _gen(m))
    q, s = ops.per_token_group_quant(x, 128)
    rq, rs = reference.quantize_per_token_group(x, 128)
    m4 = -(-m // 4) * 4
    assert q.dtype == FP8 and q.shape == (m, k) and q.is_contiguous()
    assert s.dtype == torch.float32 and s.shape == (m, k // 128) and s.stride() == (1, m4), s.stride()
    assert_bits_equal(q, rq, "q")
    assert_bits_equal(s, rs, "s")
    # From first principles: each group's amax lands on +-448 and the all-zero group stays finite.
    qf = q.float().reshape(m, -1, 128)
    amax = x.float().reshape(m, -1, 128).abs().amax(-1)
    assert (qf.abs().amax(-1)[amax >= reference.AMAX_FLOOR] == 448).all()
    assert torch.isfinite(s).all() and (s > 0).all()
    floor_scale = torch.tensor(reference.AMAX_FLOOR, dtype=torch.float32) / 448
    if k >= 384:
        assert (qf[m // 2, 2] == 0).all() and s[m // 2, 2] == floor_scale


def test_quant_opcheck():
    torch.library.opcheck(torch.ops.blockfp8.per_token_group_quant.default,
                          (_activations(5, 256, torch.bfloat16, _gen()), 128))


# ---------------------------------------------------------------------------------------------
# gemv / linear / gemm / nvfp4_linear against the reference
# ---------------------------------------------------------------------------------------------


def assert_close_with_bias(out, ref, ref_no_bias, what):
    """A kernel may round the product to the output dtype before adding the bias:
    out = fl(fl(p) + b), fl(p) = p (1 + d1), |d1|, |d2| <= u, so
    out - (p + b) = p d1 + (p + b) d2 + p d1 d2 and |out - ref| <= u |ref| + u (1 + u) |p|.
    The fp32-accumulation term u/16 * max|p| of assert_close_to_ref carries over unchanged, and in
    norm the two roundings add to at most 2u of the larger of ||ref||, ||p||."""
    o, r, p = out.double(), ref.double(), ref_no_bias.double()
    u = reference.unit_roundoff(out.dtype)
    assert torch.isfinite(o).all(), f"{what}: non-finite output"
    bound = u * r.abs() + u * (1 + u) * p.abs() + (u / 16) * max(p.abs().max().item(), r.abs().max().item())
    err = (o - r).abs()
    assert (err <= bound).all(), f"{what}: error {err.max().item():.3g} above the bound at " \
                                 f"{[int(i) for i in torch.unravel_index((err - bound).argmax(), err.shape)]}"
    scale = max(torch.linalg.vector_norm(r).item(), torch.linalg.vector_norm(p).item())
    assert torch.linalg.vector_norm(o - r).item() <= 2 * u * scale, f"{what}: norm error too large"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k", [(1, 256, 512), (7, 200, 384), (83, 576, 1024), (4, 128, 16384)])
def test_gemv(m, n, k, dtype):
    gen = _gen(n + k)
    b, bs = _weight(n, k, gen)
    if k == 16384:  # long K, all positive: a lost per-block fp32 promotion shows here
        b, bs = b.abs().contiguous(), bs
        x = torch.rand(m, k, generator=gen).to(dtype)
    else:
        x = torch.randn(m, k, generator=gen).to(dtype)
    out = ops.blockfp8_gemv(x, b, bs)
    assert out.dtype == dtype and out.shape == (m, n)
    reference.assert_close_to_ref(out, reference.gemv_ref(x, b, bs), "gemv")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead", [(5,), (2, 3), ()])
def test_linear(lead, dtype):
    gen = _gen(len(lead))
    n, k = 200, 384
    b, bs = _weight(n, k, gen)
    x = torch.randn(*lead, k, generator=gen).to(dtype)
    out = ops.blockfp8_linear(x, b, bs)
    assert out.dtype == dtype and out.shape == (*lead, n)
    reference.assert_close_to_ref(out, reference.linear_ref(x, b, bs, quantize_activations=False), "linear")


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_bias(dtype):
    gen = _gen(3)
    n, k = 256, 512
    b, bs = _weight(n, k, gen)
    x = torch.randn(2, 3, k, generator=gen).to(dtype)
    p = reference.linear_ref(x, b, bs, quantize_activations=False)
    # Bias of the outputs' own size, so a dropped or misplaced bias is far outside the bound.
    bias = (torch.randn(n, generator=gen) * p.abs().mean().item()).to(dtype)
    out = ops.blockfp8_linear(x, b, bs, bias)
    ref = reference.linear_ref(x, b, bs, bias, quantize_activations=False)
    assert out.shape == (2, 3, n)
    assert_close_with_bias(out, ref, p, "linear+bias")
    with pytest.raises(AssertionError):  # the bound is tight enough to see a dropped bias
        assert_close_with_bias(ops.blockfp8_linear(x, b, bs), ref, p, "linear without bias")


@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("m,n,k", [(1, 256, 512), (83, 576, 1024)])
def test_gemm(m, n, k, out_dtype):
    gen = _gen(m)
    b, bs = _weight(n, k, gen)
    # Huge groups only where the products stay finite in out_dtype (fp16 tops out at 65504).
    x = _activations(m, k, torch.bfloat16, gen, special=out_dtype == torch.bfloat16)
    a, a_scale = ops.per_token_group_quant(x, 128)
    out = ops.blockfp8_gemm(a, a_scale, b, bs, out_dtype)
    assert out.dtype == out_dtype and out.shape == (m, n)
    reference.assert_close_to_ref(out, reference.gemm_ref(a, a_scale, b, bs), "gemm")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
def test_nvfp4_linear(dtype, bias):
    gen = _gen(4)
    n, k = 96, 256
    packed, scale, gs = reference.quantize_nvfp4(torch.randn(n, k, generator=gen))
    x = torch.randn(2, 3, k, generator=gen).to(dtype)
    p = reference.nvfp4_linear_ref(x, packed, scale, gs)
    b = (torch.randn(n, generator=gen) * p.abs().mean().item()).to(dtype) if bias else None
    out = ops.nvfp4_linear(x, packed, scale, gs.reshape(1), b)
    assert out.dtype == dtype and out.shape == (2, 3, n)
    ref = reference.nvfp4_linear_ref(x, packed, scale, gs, b)
    if bias:
        assert_close_with_bias(out, ref, p, "nvfp4+bias")
    else:
        reference.assert_close_to_ref(out, ref, "nvfp4")
    # Per-row global scales (fused shards): rows 0..47 and 48..95 with different factors.
    per_row = torch.cat([gs.reshape(1).expand(48), (gs * 3).reshape(1).expand(48)]).contiguous()
    out = ops.nvfp4_linear(x, packed, scale, per_row)
    reference.assert_close_to_ref(out[..., 48:], reference.nvfp4_linear_ref(x, packed[48:], scale[48:], gs * 3),
                                  "nvfp4 per-row global scale")


def _opcheck_cases():
    gen = _gen(9)
    b, bs = _weight(256, 384, gen)
    x = torch.randn(3, 384, generator=gen).to(torch.bfloat16)
    bias = torch.randn(256, generator=gen).to(torch.bfloat16)
    a, a_scale = ops.per_token_group_quant(x, 128)
    packed, scale, gs = reference.quantize_nvfp4(torch.randn(64, 384, generator=gen))
    return {
        "gemv": (torch.ops.blockfp8.gemv.default, (x, b, bs, -1)),
        "gemm": (torch.ops.blockfp8.gemm.default, (a, a_scale, b, bs, torch.float16, -1)),
        "linear": (torch.ops.blockfp8.linear.default, (x, b, bs, None, -1)),
        "linear_bias": (torch.ops.blockfp8.linear.default, (x, b, bs, bias, -1)),
        "nvfp4_linear": (torch.ops.blockfp8.nvfp4_linear.default, (x, packed, scale, gs.reshape(1), None)),
        "nvfp4_linear_bias": (torch.ops.blockfp8.nvfp4_linear.default,
                              (x, packed, scale, gs.reshape(1), bias[:64].contiguous())),
        "nvfp4_linear_paired": (torch.ops.blockfp8.nvfp4_linear.default,
                                (x, reference.pair_nvfp4_weight(packed), scale, gs.reshape(1), None, -1, None, None,
                                 None, True)),
    }


@pytest.mark.parametrize("name", list(_opcheck_cases()))
def test_opcheck_fp8_ops(name):
    op, args = _opcheck_cases()[name]
    torch.library.opcheck(op, args, test_utils=FP8_OPCHECK)


def test_fakes_match_real_layout():
    """opcheck compares strides only for CUDA tensors (torch._prims_common check_significant_strides
    has only_cuda=True), yet the GEMM reads s through its M-major strides: compare them here."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    cases = [(torch.ops.blockfp8.per_token_group_quant.default, (_activations(m, 256, torch.bfloat16, _gen(m)), 128))
             for m in (1, 3, 5, 8)] + list(_opcheck_cases().values())
    for op, args in cases:
        real = op(*args)
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            fake = op(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args])
        for r, f in zip(real if isinstance(real, tuple) else (real,), fake if isinstance(fake, tuple) else (fake,)):
            meta = lambda t: (t.dtype, tuple(t.shape), t.stride(), t.storage_offset())  # noqa: E731
            assert meta(f) == meta(r), f"{op}: fake {meta(f)} != real {meta(r)}"


def test_host_ops_without_extension():
    if ops.HAS_CUDA_KERNELS and torch.cuda.is_available():
        pytest.skip("the extension is built and a GPU is present: tables are not empty")
    assert ops.tile_table("linear") == [] and ops.selected_row("gemv", 1, 256, 512) is None
    with pytest.raises(ValueError, match="family"):
        ops.tile_table("conv")
    if not ops.HAS_CUDA_KERNELS:
        assert ops.build_info()["compiled"] is False and "import_error" in ops.build_info()


# ---------------------------------------------------------------------------------------------
# Bad inputs: a ValueError that names the argument
# ---------------------------------------------------------------------------------------------


def _bad_cases():
    gen = _gen(5)
    b, bs = _weight(256, 512, gen)
    x = torch.randn(4, 512, generator=gen).to(torch.bfloat16)
    bad = shapes.UNSUPPORTED_K
    x_bad_k = torch.randn(2, bad.k, generator=gen).to(torch.bfloat16)
    b_bad_k = torch.randn(bad.n, bad.k, generator=gen).to(FP8)
    bs_bad_k = torch.ones(-(-bad.n // 128), -(-bad.k // 128))
    a, a_scale = ops.per_token_group_quant(x, 128)
    packed, scale, gs = reference.quantize_nvfp4(torch.randn(64, 512, generator=gen))
    b_t = b.view(torch.uint8).t().contiguous().t().view(FP8)  # [N, K] values, column-major storage
    return {
        "x dtype": (lambda: ops.blockfp8_linear(x.float(), b, bs), r"^x must be bfloat16 or float16"),
        "x rank": (lambda: ops.blockfp8_gemv(x[None], b, bs), r"^x must be 2-D"),
        "x last dim strided": (lambda: ops.blockfp8_gemv(x.t().contiguous().t(), b, bs), r"^x must have a contiguous"),
        "b dtype": (lambda: ops.blockfp8_linear(x, b.to(torch.bfloat16), bs), r"^b must be float8_e4m3fn"),
        "b non-contiguous": (lambda: ops.blockfp8_linear(x, b_t, bs), r"^b must be contiguous"),
        "K mismatch": (lambda: ops.blockfp8_linear(x[:, :384].contiguous(), b, bs), r"^b must have K = 384"),
        "K % 16 (linear)": (lambda: ops.blockfp8_linear(x_bad_k, b_bad_k, bs_bad_k), rf"^K = {bad.k} is not supported"),
        "K % 16 (gemv)": (lambda: ops.blockfp8_gemv(x_bad_k, b_bad_k, bs_bad_k), rf"^K = {bad.k} is not supported"),
        "K % 16 (quant)": (lambda: ops.per_token_group_quant(x_bad_k, 128), rf"^K = {bad.k} must be a multiple"),
        "b_scale shape": (lambda: ops.blockfp8_linear(x, b, bs[:, :3].contiguous()),
                          r"^b_scale must have shape .*\[2, 4\]"),
        "b_scale dtype": (lambda: ops.blockfp8_linear(x, b, bs.double()), r"^b_scale must be float32"),
        "b_scale non-contiguous": (lambda: ops.blockfp8_linear(x, b, bs.t().contiguous().t()),
                                   r"^b_scale must be contiguous"),
        "bias shape": (lambda: ops.blockfp8_linear(x, b, bs, torch.zeros(255, dtype=torch.bfloat16)),
                       r"^bias must be 1-D \[N\] = \[256\]"),
        "bias dtype": (lambda: ops.blockfp8_linear(x, b, bs, torch.zeros(256)), r"^bias must have"),
        "group_size": (lambda: ops.per_token_group_quant(x, 64), r"^group_size must be 128"),
        "quant x dtype": (lambda: ops.per_token_group_quant(x.float(), 128), r"^x must be bfloat16"),
        "gemm a dtype": (lambda: ops.blockfp8_gemm(x, a_scale, b, bs), r"^a must be float8_e4m3fn"),
        "gemm a_scale shape": (lambda: ops.blockfp8_gemm(a, a_scale[:2], b, bs),
                               r"^a_scale must be float32 \[M, K/128\]"),
        "gemm out_dtype": (lambda: ops.blockfp8_gemm(a, a_scale, b, bs, torch.float32), r"^out_dtype must be"),
        "gemm K % 128": (lambda: ops.blockfp8_gemm(a[:, :496], a_scale, b[:, :496].contiguous(), bs),
                         r"^K = 496 is not supported: it must be a multiple of 128"),
        "nvfp4 b dtype": (lambda: ops.nvfp4_linear(x, packed.to(torch.int8), scale, gs), r"^b must be uint8"),
        "nvfp4 b_scale shape": (lambda: ops.nvfp4_linear(x, packed, scale[:, :8].contiguous(), gs),
                                r"^b_scale must be float8_e4m3fn \[N, K/16\]"),
        "nvfp4 global_scale": (lambda: ops.nvfp4_linear(x, packed, scale, torch.ones(3)), r"^global_scale must be"),
        "nvfp4 bias": (lambda: ops.nvfp4_linear(x, packed, scale, gs, torch.zeros(63, dtype=torch.bfloat16)),
                       r"^bias must be \[N\]"),
        # The native GEMM reads the ModelOpt packing: a paired b cannot go to it.
        "nvfp4 native with a paired b": (lambda: ops.nvfp4_linear(
            x, reference.pair_nvfp4_weight(packed), scale, gs,
            native=ops.nvfp4_native_operands(scale, torch.ones(1), gs.reshape(1)), packing="paired"),
            r"^native needs packing='modelopt'"),
        "nvfp4 packing": (lambda: ops.nvfp4_linear(x, packed, scale, gs, packing="paird"), r"^packing must be one of"),
        "nvfp4 fragment b_scale dtype": (lambda: ops.nvfp4_linear(x, packed, scale, gs, packing="fragment"),
                                         r"^b_scale must be uint8 \[N, K/16\]"),
    }


@pytest.mark.parametrize("case", list(_bad_cases()))
def test_bad_input(case):
    call, match = _bad_cases()[case]
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="device mismatch needs a CUDA device")
def test_device_mismatch():
    b, bs = _weight(256, 512, _gen())
    x = torch.randn(4, 512, device="cuda").to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"^b is on cpu but the activations are on cuda"):
        ops.blockfp8_linear(x, b, bs)
    with pytest.raises(ValueError, match=r"^b_scale is on cpu"):
        ops.blockfp8_linear(x, b.cuda(), bs)


# ---------------------------------------------------------------------------------------------
# torch.compile
# ---------------------------------------------------------------------------------------------


class _Linear(torch.nn.Module):
    """The shape of a vLLM layer: weights are module parameters (static shapes under Dynamo)."""

    def __init__(self, n, k, gen):
        super().__init__()
        b, bs = _weight(n, k, gen)
        self.weight = torch.nn.Parameter(b, requires_grad=False)
        self.weight_scale_inv = torch.nn.Parameter(bs, requires_grad=False)
        self.bias = torch.nn.Parameter(torch.randn(n, generator=gen).to(torch.bfloat16), requires_grad=False)

    def forward(self, x):
        return ops.blockfp8_linear(x, self.weight, self.weight_scale_inv, self.bias)


def test_compile_fullgraph_dynamic():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    gen = _gen(11)
    layer = _Linear(256, 384, gen)
    compiled = torch.compile(layer, fullgraph=True, dynamic=True)
    # M = 3 equals K's block count: the validation must not tie M to the scale shape.
    for shape, graphs in (((3, 384), 1), ((17, 384), 1), ((2, 5, 384), 2), ((4, 7, 384), 2)):
        x = torch.randn(*shape, generator=gen).to(torch.bfloat16)
        assert torch.equal(compiled(x), layer(x)), shape
        assert counters["stats"]["unique_graphs"] == graphs, f"recompiled for {shape}: M was specialized"


# ---------------------------------------------------------------------------------------------
# Reference self-checks (the reference is the contract, so check it from first principles)
# ---------------------------------------------------------------------------------------------


def test_block_fp8_round_trip_error_bound():
    """e4m3 keeps 3 mantissa bits: in [2^e, 2^(e+1)) its spacing is 2^(e-3), so round-to-nearest is
    off by at most half of it, 2^(e-4) <= 2^-4 |v|, for normal |v| >= 2^-6 (scaled units). Below
    2^-6 the spacing is the subnormal 2^-9, so the error is at most 2^-10 absolute. The fp32
    division and the fp32 multiply back add 2^-24 relative each."""
    gen = _gen(12)
    w = torch.randn(300, 520, generator=gen) * torch.exp(2 * torch.randn(300, 1, generator=gen))
    q, s = reference.quantize_block_fp8(w)
    assert q.shape == w.shape and s.shape == (3, 5)
    deq = reference.dequantize_block_fp8(q, s)
    se = reference.expand_block_scale(s, 300, 520)
    v = (w / se).abs()
    err = (deq - w).abs()
    normal = v >= 2.0**-6
    assert (err[normal] <= (2.0**-4 + 2.0**-22) * w.abs()[normal]).all()
    assert (err[~normal] <= (2.0**-10 + 2.0**-22) * se[~normal]).all()
    # and not a finer format in disguise: the worst relative error is close to the bound
    assert (err[normal] / w.abs()[normal]).max() > 2.0**-5
    # every tile's amax maps to +-448 (edge tiles use the elements they hold)
    tiles = torch.nn.functional.pad(q.float().abs(), (0, 120, 0, 84)).reshape(3, 128, 5, 128)
    assert (tiles.amax(dim=(1, 3)) == 448).all()


def test_block_fp8_exact_on_grid():
    gen = _gen(13)
    codes = torch.randint(0, 256, (256, 384), generator=gen, dtype=torch.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x11  # drop NaN encodings
    codes[0::128, 0::128] = 0x7E  # 448 in every tile, so its amax fixes the scale exactly
    q = codes.view(FP8)
    s = 2.0 ** torch.randint(-20, 4, (2, 3), generator=gen).float()
    w = reference.dequantize_block_fp8(q, s)
    q2, s2 = reference.quantize_block_fp8(w)
    assert_bits_equal(s2, s, "scales")
    want = codes.clone()
    want[want == 0x80] = 0x80  # -0 stays -0: the sign of zero survives w / s
    assert_bits_equal(q2, want.view(FP8), "codes")


def test_nvfp4_round_trip_exact_on_grid():
    gen = _gen(14)
    n, k = 64, 256
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    codes[codes == 8] = 0  # -0 encodes as +0 (the quantizer writes no negative zero)
    codes[:, 0::16] = 7 + 8 * (codes[:, 0::16] >= 8).to(torch.uint8)  # +-6 in every group
    scale_bytes = torch.randint(0x08, 0x7E, (n, k // 16), generator=gen, dtype=torch.uint8)  # normal e4m3
    scale_bytes[0, 0] = 0x7E  # 448: sets the global amax
    gs = torch.tensor(2.0**-10)
    w = reference.e2m1_decode(codes).reshape(n, -1, 16) * scale_bytes.view(FP8).float().unsqueeze(-1) * gs
    packed, scale, gs2 = reference.quantize_nvfp4(w.reshape(n, k))
    assert gs2.item() == gs.item()
    assert_bits_equal(scale, scale_bytes.view(FP8), "nvfp4 scales")
    assert_bits_equal(packed, codes[:, 0::2] | (codes[:, 1::2] << 4), "nvfp4 packed codes")
    assert torch.equal(reference.dequantize_nvfp4(packed, scale, gs2), w.reshape(n, k))


def _e2m1_nearest_even(v: torch.Tensor) -> torch.Tensor:
    """Independent E2M1 rounding: nearest grid magnitude, ties to the even code, saturating."""
    grid = torch.tensor(reference.E2M1_VALUES, dtype=torch.float64)
    d = (v.abs().double().clamp(max=6.0).unsqueeze(-1) - grid).abs()
    best = d.min(-1, keepdim=True).values
    tied = d == best
    even = tied & (torch.arange(8) % 2 == 0)
    code = torch.where(even.any(-1), even.float().argmax(-1), tied.float().argmax(-1)).to(torch.uint8)
    return code | (((v < 0) & (code > 0)).to(torch.uint8) << 3)


def test_e2m1_ties_to_even():
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    want = torch.tensor([0, 2, 2, 4, 4, 6, 6], dtype=torch.uint8)  # 0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0
    assert torch.equal(reference._e2m1_codes(mids), want)
    assert torch.equal(reference._e2m1_codes(-mids), torch.where(want > 0, want | 8, want))
    above = torch.nextafter(mids, torch.tensor(math.inf))
    below = torch.nextafter(mids, torch.tensor(0.0))
    assert torch.equal(reference._e2m1_codes(above), torch.tensor([1, 2, 3, 4, 5, 6, 7], dtype=torch.uint8))
    assert torch.equal(reference._e2m1_codes(below), torch.tensor([0, 1, 2, 3, 4, 5, 6], dtype=torch.uint8))
    sweep = torch.cat([torch.arange(-8 * 64, 8 * 64 + 1) / 64.0, torch.randn(4096, generator=_gen(15)) * 3])
    assert torch.equal(reference._e2m1_codes(sweep), _e2m1_nearest_even(sweep))
    assert torch.equal(reference.e2m1_decode(torch.arange(16, dtype=torch.uint8)),
                       torch.tensor([0.0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6]))
