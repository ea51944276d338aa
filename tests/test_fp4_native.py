"""Native NVFP4 x NVFP4 (W4A4, SM120): the activation quantizer, the scale-factor swizzle, the GEMM, the path rule.

CPU: the reference quantizer against hand-computed groups (rounding to nearest even on the E2M1 grid, the e4m3
scale, saturation, zero groups), its round trip error, the swizzle as a permutation with an inverse, the ops'
CPU paths and fakes, and the host-side path rule (needs the compiled extension, not a GPU).
GPU: the quantizer and both swizzles bit for bit against the reference (any CUDA GPU: arch-neutral kernels), the
native GEMM and the native linear path against the float64 W4A4 reference (SM120 only), CUDA graph capture.
The GEMM's error bound: its operands are exact e2m1 * e4m3 values, products are exact in fp32, so it differs from
the float64 reference only by fp32 accumulation and the output rounding (reference.assert_close_to_ref).
"""

from __future__ import annotations

import pytest
import torch
from conftest import needs_kernels, poison_cuda_cache

from vllm_blockfp8 import ops, reference

DTYPES = (torch.bfloat16, torch.float16)


def _input_scale(x: torch.Tensor) -> torch.Tensor:
    return (x.float().abs().amax() / (6 * 448)).reshape(1)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == reference.FP8_DTYPE else t


# --------------------------------------------------------------------------------------------
# Reference quantizer (CPU)
# --------------------------------------------------------------------------------------------


def test_quantizer_hand_computed_group():
    """One group with amax 6 and input_scale 1: s = e4m3(6 / 6 / 1) = 1, so codes are e2m1(x) directly, with
    ties to even (0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4) and -0.1 -> +0."""
    vals = [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.1, -0.5, -1.5, -3.0, -6.0, 0.3, 2.9, 4.9]
    want = [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 0.0, -0.5, -1.5, -3.0, -6.0, 0.5, 3.0, 4.0]
    x = torch.tensor([vals + vals], dtype=torch.bfloat16)  # K = 32: two identical groups
    q, s = reference.quantize_nvfp4_activations(x, torch.tensor([1.0]))
    assert s.float().tolist() == [[1.0, 1.0]]
    deq = reference.dequantize_nvfp4(q, s, 1.0)
    assert deq[0, :16].tolist() == want
    assert q[0, 0].item() == (0x7 | (0x0 << 4))  # element 0 in the low nibble: +6 = code 7, +0.25 -> 0
    assert reference.e2m1_decode(q[0, 4] & 0xF).item() == 0.0 and (q[0, 4] & 0xF).item() == 0  # -0.1 -> +0


def test_quantizer_scale_rounding_and_saturation():
    """s = e4m3(amax / 6 / input_scale): amax 3 with input_scale 0.25 gives 2 exactly; amax 2 gives 1.333.. ->
    e4m3 1.375 (RNE on 3 mantissa bits); an input_scale too small for the data saturates s at 448 and the codes
    at 6; an all-zero group gets s = 0 and codes 0."""
    row = torch.zeros(1, 64, dtype=torch.float32)
    row[0, 0] = 3.0
    row[0, 16] = 2.0
    row[0, 32] = 1e4
    x = row.to(torch.bfloat16)
    q, s = reference.quantize_nvfp4_activations(x, torch.tensor([0.25]))
    assert s.float()[0].tolist() == [2.0, 1.375, 448.0, 0.0]
    deq = reference.dequantize_nvfp4(q, s, 0.25)
    assert deq[0, 0].item() == 3.0  # 3 / (2 * 0.25) = 6 -> code 7
    assert deq[0, 16].item() == pytest.approx(1.375 * 0.25 * 6)  # 2 / 0.34375 = 5.8 -> 6
    assert deq[0, 32].item() == 448 * 0.25 * 6  # saturated
    assert (q[0, 24:] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_quantizer_round_trip(seeded, dtype):
    """Random rows with a calibrated input_scale: the dequantized values are within half an E2M1 step of x
    per group (<= 1/6 of the group's amax plus the e4m3 scale's relative 2^-4), and ~9% in norm for Gaussian
    data (E2M1's 3 bits)."""
    x = (torch.randn(37, 256, generator=seeded) * torch.rand(37, 1, generator=seeded) * 4).to(dtype)
    isc = _input_scale(x)
    q, s = reference.quantize_nvfp4_activations(x, isc)
    assert q.shape == (37, 128) and q.dtype == torch.uint8 and s.shape == (37, 16) and s.dtype == reference.FP8_DTYPE
    deq = reference.dequantize_nvfp4(q, s, isc)
    err = (deq - x.float()).abs().reshape(37, 16, 16)
    amax = x.float().abs().reshape(37, 16, 16).amax(-1, keepdim=True)
    assert (err <= amax * (1 / 6 + 1 / 16) + 1e-6).all()
    rel = ((deq - x.float()).norm() / x.float().norm()).item()
    assert 0.05 < rel < 0.13


# --------------------------------------------------------------------------------------------
# Swizzle (CPU)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rows,k", [(1, 32), (128, 64), (200, 96), (300, 4096 + 32)])
def test_swizzle_is_a_permutation_with_inverse(rows, k):
    offsets = reference.nvfp4_sf_offsets(rows, k)
    pr, pc = reference.nvfp4_sf_shape(rows, k)
    assert offsets.shape == (pr, pc) and pr % 128 == 0 and pc % 4 == 0
    assert torch.equal(offsets.reshape(-1).sort().values, torch.arange(pr * pc))  # a bijection
    scale = torch.randint(1, 120, (rows, k // 16), dtype=torch.uint8).view(reference.FP8_DTYPE)
    swz = reference.swizzle_nvfp4_scale(scale)
    assert swz.shape == (pr, pc)
    assert torch.equal(_bits(reference.unswizzle_nvfp4_scale(swz, rows, k)), _bits(scale))
    assert int((_bits(swz) != 0).sum()) == rows * (k // 16)  # padding is 0, every scale is nonzero


def test_swizzle_layout_fixed_points():
    """The CUTLASS SfKMajorAtom offsets stated in csrc/fp4/native.h, at hand-picked coordinates."""
    off = reference.nvfp4_sf_offsets(256, 16 * 8)  # 2 x 2 atoms
    assert off[0, 0] == 0 and off[0, 3] == 3 and off[1, 0] == 16 and off[32, 0] == 4 and off[127, 3] == 31 * 16 + 12 + 3
    assert off[0, 4] == 512 and off[128, 0] == 1024 and off[129, 5] == 1024 + 512 + 16 + 1


# --------------------------------------------------------------------------------------------
# Ops on CPU (the reference backend) and their fakes
# --------------------------------------------------------------------------------------------


def _operands(m=40, n=64, k=256, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = torch.randn(n, k, generator=g) * 0.05
    b, bs, bg = reference.quantize_nvfp4(w)
    return x, b, bs, bg.reshape(1)


def test_ops_cpu_match_reference():
    x, b, bs, bg = _operands()
    isc = _input_scale(x)
    q, sf = ops.nvfp4_quant(x, isc)
    rq, rs = reference.quantize_nvfp4_activations(x, isc)
    assert torch.equal(q, rq) and torch.equal(_bits(sf), _bits(reference.swizzle_nvfp4_scale(rs)))
    bsw = ops.nvfp4_swizzle_scale(bs)
    out = ops.nvfp4_gemm(q, sf, b, bsw, (isc * bg).reshape(1), torch.bfloat16)
    ref = reference.nvfp4_w4a4_linear_ref(x, isc, b, bs, bg)
    reference.assert_close_to_ref(out, ref, "nvfp4_gemm (CPU)")
    # The CPU linear stays weight-only even with native operands (the native path needs SM120 kernels).
    native = ops.nvfp4_native_operands(bs, isc, bg)
    lin = ops.nvfp4_linear(x, b, bs, bg, native=native)
    reference.assert_close_to_ref(lin, reference.nvfp4_linear_ref(x, b, bs, bg), "nvfp4_linear (CPU, native given)")


def test_ops_validation():
    x, b, bs, bg = _operands()
    with pytest.raises(ValueError, match="input_scale"):
        ops.nvfp4_quant(x, torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="multiple of 32"):
        ops.nvfp4_quant(x[:, :48], torch.tensor([1.0]))
    with pytest.raises(ValueError, match="swizzled"):
        ops.nvfp4_gemm(b[:40], bs[:40], b, ops.nvfp4_swizzle_scale(bs), torch.ones(1), torch.bfloat16)
    with pytest.raises(ValueError, match="b_scale_swizzled"):
        ops.nvfp4_linear(x, b, bs, bg, native={"b_scale_swizzled": bs, "input_scale": torch.ones(1),
                                              "alpha": torch.ones(1)})


def test_fakes_and_compile():
    """The fakes give the ops' shapes, so torch.compile traces them as one node each."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    x, b, bs, bg = _operands(m=5)
    with FakeTensorMode() as mode:
        fx, fb, fbs = mode.from_tensor(x), mode.from_tensor(b), mode.from_tensor(bs)
        q, sf = torch.ops.blockfp8.nvfp4_quant(fx, mode.from_tensor(torch.ones(1)))
        assert q.shape == (5, 128) and sf.shape == (128, 16) and sf.dtype == reference.FP8_DTYPE
        assert torch.ops.blockfp8.nvfp4_swizzle_scale(fbs).shape == (128, 16)
        out = torch.ops.blockfp8.nvfp4_gemm(q, sf, fb, torch.ops.blockfp8.nvfp4_swizzle_scale(fbs),
                                            mode.from_tensor(torch.ones(1)), torch.float16)
        assert out.shape == (5, 64) and out.dtype == torch.float16

    isc = _input_scale(x)
    compiled = torch.compile(lambda t: ops.nvfp4_quant(t, isc), fullgraph=True, backend="eager")
    q1, s1 = compiled(x)
    q2, s2 = ops.nvfp4_quant(x, isc)
    assert torch.equal(q1, q2) and torch.equal(_bits(s1), _bits(s2))


# --------------------------------------------------------------------------------------------
# Host side: the rows this build has and the path rule (the extension, no GPU)
# --------------------------------------------------------------------------------------------

needs_extension = pytest.mark.skipif(not ops.HAS_CUDA_KERNELS, reason="needs the compiled extension (host logic)")


@needs_extension
def test_native_rows_listed():
    rows = ops.nvfp4_native_rows()
    if "12.0a" not in ops.build_info()["archs"]:
        assert rows == []
        return
    assert [r["name"] for r in rows] == ["nvfp4_sm120_128x128x256", "nvfp4_sm120_128x128x128"]
    assert rows[0]["max_m"] == 128 and rows[-1]["max_m"] is None and all(r["reason"] for r in rows)
    assert ops.build_info()["families"]["nvfp4_native"] == ["sm120"]


@needs_extension
def test_native_path_rule(monkeypatch):
    if not ops.nvfp4_native_rows():
        assert ops.nvfp4_native_path((12, 0), 64, 4096, 4096)["native"] is False
        pytest.skip("this build has no sm_120a")
    path = ops.nvfp4_native_path
    assert path((12, 0), 17, 4096, 4096) == {"native": True, "row": "nvfp4_sm120_128x128x256"}
    assert path((12, 0), 128, 6144, 4096)["row"] == "nvfp4_sm120_128x128x256"
    assert path((12, 0), 129, 4096, 12288)["row"] == "nvfp4_sm120_128x128x128"
    assert path((12, 0), 64, 4096, 4096 + 128)["row"] == "nvfp4_sm120_128x128x128"  # K % 256 != 0
    for m in (1, 8, 16):
        assert "decode GEMV" in path((12, 0), m, 4096, 4096)["why"]
    for cc in ((9, 0), (8, 9), (10, 0), (12, 1)):
        assert "12.0 only" in path(cc, 64, 4096, 4096)["why"]
    assert "N % 32" in path((12, 0), 64, 4100, 4096)["why"]
    assert "K % 128" in path((12, 0), 64, 4096, 4096 + 32)["why"]


def test_w4a16_switch_is_read_once_per_process():
    """BLOCKFP8_NVFP4_W4A16=1 keeps SM120 weight-only: checked in a fresh process (the C++ reads it once)."""
    if not ops.HAS_CUDA_KERNELS or not ops.nvfp4_native_rows():
        pytest.skip("needs the compiled extension with sm_120a")
    import os
    import subprocess
    import sys

    code = "from vllm_blockfp8 import ops; print(ops.nvfp4_native_path((12, 0), 64, 4096, 4096)['why'])"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "BLOCKFP8_NVFP4_W4A16": "1"},
                         capture_output=True, text=True, check=True).stdout
    assert "BLOCKFP8_NVFP4_W4A16" in out


# --------------------------------------------------------------------------------------------
# GPU: bit-exact kernels (any GPU), the native GEMM and path (SM120), graph capture
# --------------------------------------------------------------------------------------------


@needs_kernels()
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k", [(1, 32), (7, 96), (83, 4096), (300, 12288)])
def test_quant_kernel_bit_exact(dtype, m, k):
    g = torch.Generator().manual_seed(m + k)
    x = (torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g) * 8).to(dtype)
    x[0, :16] = 0  # a zero group: s = 0, codes 0
    isc = _input_scale(x) * 0.5  # some groups saturate
    poison_cuda_cache(m * k // 2, int(torch.tensor(reference.nvfp4_sf_shape(m, k)).prod()))
    q, sf = ops.nvfp4_quant(x.cuda(), isc.cuda())
    rq, rs = reference.quantize_nvfp4_activations(x, isc)
    assert reference.first_mismatch(q, rq) is None, f"codes differ at {reference.first_mismatch(q, rq)}"
    want = reference.swizzle_nvfp4_scale(rs)
    assert reference.first_mismatch(sf, want) is None, f"scales differ at {reference.first_mismatch(sf, want)}"


@needs_kernels()
def test_quant_kernel_unaligned_rows():
    x = torch.randn(9, 32 * 5 + 8, dtype=torch.bfloat16)[:, 8:]  # 336-byte rows: the op copies x to aligned rows
    isc = _input_scale(x)
    q, sf = ops.nvfp4_quant(x.cuda(), isc.cuda())
    rq, rs = reference.quantize_nvfp4_activations(x, isc)
    assert torch.equal(q.cpu(), rq) and torch.equal(_bits(sf.cpu()), _bits(reference.swizzle_nvfp4_scale(rs)))


@needs_kernels()
@pytest.mark.parametrize("rows,k", [(1, 32), (200, 96), (4096, 4096), (6144, 4096 + 32)])
def test_swizzle_kernel_bit_exact(rows, k):
    scale = torch.randint(0, 126, (rows, k // 16), dtype=torch.uint8).view(reference.FP8_DTYPE)
    poison_cuda_cache(int(torch.tensor(reference.nvfp4_sf_shape(rows, k)).prod()))
    got = ops.nvfp4_swizzle_scale(scale.cuda())
    want = reference.swizzle_nvfp4_scale(scale)
    assert reference.first_mismatch(got, want) is None, f"differs at {reference.first_mismatch(got, want)}"


@needs_kernels(capability=(12, 0))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k", [(17, 4096, 4096), (83, 576, 7168), (128, 6144, 4096), (300, 4096, 12288),
                                   (1024, 2048, 128 * 3)])
def test_native_gemm_rows(dtype, m, n, k):
    x, b, bs, bg = _operands(m, n, k, dtype, seed=m)
    isc = _input_scale(x)
    q, sf = ops.nvfp4_quant(x.cuda(), isc.cuda())
    bsw = ops.nvfp4_swizzle_scale(bs.cuda())
    alpha = (isc * bg).cuda()
    ref = reference.nvfp4_w4a4_linear_ref(x, isc, b, bs, bg)
    for i, row in enumerate(ops.nvfp4_native_rows()):
        if k % int(row["name"].rsplit("x", 1)[1]):
            continue
        poison_cuda_cache(m * n * 2)
        out = ops.nvfp4_gemm(q, sf, b.cuda(), bsw, alpha, dtype, row=i)
        reference.assert_close_to_ref(out, ref, f"{row['name']} M={m} N={n} K={k}")
        # The row itself answered: one that failed its first-use check yields to the reference kernel (same bound).
        state = {r["name"]: r for r in ops.nvfp4_self_check()}[row["name"]]
        assert state["state"] == "passed", f"{row['name']} did not serve the call: {state}"


@needs_kernels(capability=(12, 0))
@pytest.mark.parametrize("m", [1, 16, 17, 200])
def test_native_linear_path_and_graph(m):
    """M <= 16 stays on the weight-only GEMV (the plain scales); above, W4A4; both capture in a CUDA graph."""
    x, b, bs, bg = _operands(m, 4096, 4096, torch.bfloat16, seed=1)
    isc = _input_scale(x)
    xc, bc, bsc, bgc = x.cuda(), b.cuda(), bs.cuda(), bg.cuda()
    native = ops.nvfp4_native_operands(bsc, isc.cuda(), bgc)
    bias = torch.randn(4096, dtype=torch.bfloat16).cuda()
    out = ops.nvfp4_linear(xc, bc, bsc, bgc, bias, native=native)
    if ops.nvfp4_native_path((12, 0), m, 4096, 4096)["native"]:
        ref = reference.nvfp4_w4a4_linear_ref(x, isc, b, bs, bg, bias)
    else:
        ref = reference.nvfp4_linear_ref(x, b, bs, bg, bias)
    reference.assert_close_to_ref(out, ref, f"nvfp4_linear M={m}")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = ops.nvfp4_linear(xc, bc, bsc, bgc, bias, native=native)
    # Replayed on new activations written in place (a graph that baked its inputs in would replay the old answer),
    # against the reference on them and the eager call.
    x2 = _operands(m, 4096, 4096, torch.bfloat16, seed=2)[0]
    xc.copy_(x2.cuda())
    captured.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    if ops.nvfp4_native_path((12, 0), m, 4096, 4096)["native"]:
        ref2 = reference.nvfp4_w4a4_linear_ref(x2, isc, b, bs, bg, bias)
    else:
        ref2 = reference.nvfp4_linear_ref(x2, b, bs, bg, bias)
    reference.assert_close_to_ref(captured, ref2, f"nvfp4_linear graph replay M={m}")
    assert torch.equal(captured, ops.nvfp4_linear(xc, bc, bsc, bgc, bias, native=native))


@needs_kernels()
def test_quant_and_swizzle_capture_in_graph():
    x = torch.randn(64, 512, dtype=torch.float16).cuda()
    isc = _input_scale(x).cuda()
    scale = torch.randint(0, 126, (256, 32), dtype=torch.uint8).view(reference.FP8_DTYPE).cuda()
    q0, s0 = ops.nvfp4_quant(x, isc)
    w0 = ops.nvfp4_swizzle_scale(scale)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q1, s1 = ops.nvfp4_quant(x, isc)
        w1 = ops.nvfp4_swizzle_scale(scale)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(q0, q1) and torch.equal(_bits(s0), _bits(s1)) and torch.equal(_bits(w0), _bits(w1))
