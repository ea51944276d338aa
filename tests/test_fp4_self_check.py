"""First-use self-check of the SM120 native NVFP4 rows (csrc/fp4/first_use.cpp, registry csrc/common/first_use.h).

CPU: the rows' states as the host op lists them (needs the compiled extension, not a GPU), the reference op's CPU
implementation, validation and fake.
GPU (any CUDA GPU: the reference, fill and compare kernels are arch-neutral): the reference kernel against
reference.py's float64 NVFP4 math on random operands (within its own fp32 accumulation bound), the whole check with
the reference standing in for the row (it must pass), and the comparison flagging a corrupted output.
SM120 (in subprocesses: the switches are read once per process): BLOCKFP8_SELF_CHECK_CORRUPT forces one warning, the
row failed, nvfp4_linear on the W4A16 path and nvfp4_gemm on the reference kernel; without it every row passes; a
capture with the row unchecked takes the W4A16 path and leaves the row unchecked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import needs_kernels

from vllm_blockfp8 import ops, reference

needs_extension = pytest.mark.skipif(not ops.HAS_CUDA_KERNELS, reason="needs the compiled extension (host logic)")


def _random_operands(m, n, k, seed=0, device="cpu"):
    """Every byte value as two codes, positive e4m3 scales from the subnormals to 448 (no NaN), swizzled."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(0, 256, (m, k // 2), generator=g, dtype=torch.uint8)
    b = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8)
    sa = torch.randint(1, 127, (m, k // 16), generator=g, dtype=torch.uint8).view(reference.FP8_DTYPE)
    sb = torch.randint(1, 127, (n, k // 16), generator=g, dtype=torch.uint8).view(reference.FP8_DTYPE)
    alpha = torch.rand(1, generator=g) * 2 + 0.1
    return [t.to(device) for t in (a, reference.swizzle_nvfp4_scale(sa), b, reference.swizzle_nvfp4_scale(sb),
                                   alpha)] + [sa, sb]


def _float64_ref(a, sa, b, sb, alpha):
    """reference.py's NVFP4 GEMM and the magnitudes (sign bits cleared) in float64."""
    ref = reference.nvfp4_gemm_ref(a, sa, b, sb, alpha)

    def mags(t):
        return t.view(torch.uint8) & (0x77 if t.dtype == torch.uint8 else 0x7F)

    mag = reference.nvfp4_gemm_ref(mags(a), mags(sa).view(reference.FP8_DTYPE), mags(b),
                                   mags(sb).view(reference.FP8_DTYPE), alpha.abs())
    return ref, mag


# --------------------------------------------------------------------------------------------
# CPU
# --------------------------------------------------------------------------------------------


@needs_extension
def test_states_start_unchecked():
    """Every native row is listed (none without sm_120a), unchecked, with no detail, before any call."""
    states = ops.nvfp4_self_check()
    assert [s["name"] for s in states] == [r["name"] for r in ops.nvfp4_native_rows()]
    assert all(s["state"] == "unchecked" and s["detail"] == "" for s in states)


@needs_extension
def test_states_unchecked_in_fresh_process_with_switches():
    """The switches alone run nothing: a fresh process with both set lists every row unchecked."""
    code = "import json; from vllm_blockfp8 import ops; print(json.dumps(ops.nvfp4_self_check()))"
    env = dict(os.environ, BLOCKFP8_SELF_CHECK="always", BLOCKFP8_SELF_CHECK_CORRUPT="nvfp4_sm120_128x128x256")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    states = json.loads(out.strip().splitlines()[-1])
    assert all(s["state"] == "unchecked" for s in states)


@needs_extension
def test_self_check_run_row_out_of_range():
    """Refused before any device is touched: a ValueError from the wrapper, the reason from the raw op (no exception
    leaves a host op)."""
    for row in (-2, len(ops.nvfp4_native_rows())):
        with pytest.raises(ValueError, match="out of range"):
            ops.nvfp4_self_check_run(row)
        assert "out of range" in torch.ops.blockfp8.nvfp4_self_check_run(row, False)


@pytest.mark.parametrize("m,n,k", [(1, 32, 16), (37, 72, 256)])
def test_reference_op_cpu(m, n, k):
    """The op's CPU implementation is reference.py's math: the result and the magnitudes (>= |result|)."""
    a, a_sf, b, b_sf, alpha, sa, sb = _random_operands(m, n, k, seed=m)
    ref, mag = ops.nvfp4_gemm_reference(a, a_sf, b, b_sf, alpha)
    want, want_mag = _float64_ref(a, sa, b, sb, alpha)
    assert ref.dtype == mag.dtype == torch.float32 and ref.shape == mag.shape == (m, n)
    assert torch.equal(ref, want.float()) and torch.equal(mag, want_mag.float())
    assert (mag >= ref.abs()).all()


def test_reference_op_validation_and_fake():
    a, a_sf, b, b_sf, alpha, _, _ = _random_operands(4, 32, 64)
    with pytest.raises(ValueError, match="a_scale"):
        ops.nvfp4_gemm_reference(a, a_sf[:64], b, b_sf, alpha)
    with pytest.raises(ValueError, match="alpha"):
        ops.nvfp4_gemm_reference(a, a_sf, b, b_sf, alpha.double())
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fa, fas, fb, fbs, fal = (mode.from_tensor(t) for t in (a, a_sf, b, b_sf, alpha))
        ref, mag = torch.ops.blockfp8.nvfp4_gemm_reference(fa, fas, fb, fbs, fal)
    assert ref.shape == mag.shape == (4, 32) and ref.dtype == torch.float32


# --------------------------------------------------------------------------------------------
# GPU: the yardstick (any CUDA GPU)
# --------------------------------------------------------------------------------------------


@needs_kernels()
@pytest.mark.parametrize("m,n,k", [(1, 32, 16), (37, 72, 256), (197, 288, 512), (130, 40, 4096)])
def test_reference_kernel_matches_reference_py(m, n, k):
    """The kernel's products and 16-value group dots are exact, so it differs from float64 only by its fp32 sum over
    K / 16 groups and the product with alpha: <= (K / 16 + 1) 2^-24 mag, mag itself within the same bound."""
    a, a_sf, b, b_sf, alpha, sa, sb = _random_operands(m, n, k, seed=k)
    ref, mag = ops.nvfp4_gemm_reference(*(t.cuda() for t in (a, a_sf, b, b_sf, alpha)))
    want, want_mag = _float64_ref(a, sa, b, sb, alpha)
    bound = (k // 16 + 1) * 2.0**-24 * want_mag + 1e-30
    err = (ref.cpu().double() - want).abs()
    assert (err <= bound).all(), f"worst error {(err / bound).max().item():.3g} x the fp32 accumulation bound"
    assert ((mag.cpu().double() - want_mag).abs() <= bound).all()


@needs_kernels()
def test_self_check_of_the_reference_passes():
    """The whole check (deterministic problem, fill, reference, both output types, comparison) with the reference
    kernel writing D: it must pass, or the tolerance or the problem is wrong."""
    assert ops.nvfp4_self_check_run(-1) == ""


@needs_kernels()
def test_compare_flags_a_corrupted_output():
    why = ops.nvfp4_self_check_run(-1, corrupt=True)
    assert why.startswith("1 of ") and "bf16 outputs" in why and "BLOCKFP8_SELF_CHECK_CORRUPT" in why, why




# --------------------------------------------------------------------------------------------
# SM120: the check on the native rows
# --------------------------------------------------------------------------------------------

_SCRIPT = r"""
import json, sys, torch
from vllm_blockfp8 import ops, reference
mode = sys.argv[1]
g = torch.Generator().manual_seed(0)
m, n, k = 40, 288, 512
x = torch.randn(m, k, generator=g).to(torch.bfloat16)
b, bs, bg = reference.quantize_nvfp4(torch.randn(n, k, generator=g) * 0.05)
bg = bg.reshape(1)
isc = (x.float().abs().amax() / (6 * 448)).reshape(1)
xc, bc, bsc, bgc = x.cuda(), b.cuda(), bs.cuda(), bg.cuda()
native = ops.nvfp4_native_operands(bsc, isc.cuda(), bgc)
w4a16 = reference.nvfp4_linear_ref(x, b, bs, bg)
w4a4 = reference.nvfp4_w4a4_linear_ref(x, isc, b, bs, bg)
out = {}
if mode == "capture":
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = ops.nvfp4_linear(xc, bc, bsc, bgc, native=native)
    graph.replay()
    torch.cuda.synchronize()
    reference.assert_close_to_ref(captured, w4a16, "captured with the row unchecked: W4A16")
    out["after_capture"] = ops.nvfp4_self_check()
first = ops.nvfp4_linear(xc, bc, bsc, bgc, native=native)
second = ops.nvfp4_linear(xc, bc, bsc, bgc, native=native)
failed = [s["name"] for s in ops.nvfp4_self_check() if s["state"] == "failed"]
for o in (first, second):
    reference.assert_close_to_ref(o, w4a16 if failed else w4a4, "nvfp4_linear")
q, sf = ops.nvfp4_quant(xc, isc.cuda())
direct = ops.nvfp4_gemm(q, sf, bc, native["b_scale_swizzled"], native["alpha"], torch.bfloat16, row=0)
rq, rs = reference.quantize_nvfp4_activations(x, isc)
reference.assert_close_to_ref(direct, reference.nvfp4_gemm_ref(rq, rs, b, bs, (isc * bg)), "nvfp4_gemm row 0")
big = torch.randn(200, k, generator=g).to(torch.bfloat16).cuda()
ops.nvfp4_linear(big, bc, bsc, bgc, native=native)  # M = 200: the unbounded row
out["states"] = ops.nvfp4_self_check()
print(json.dumps(out))
"""


def _run(mode, **env_extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLOCKFP8_SELF_CHECK")}
    env.update(env_extra)
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, mode], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@needs_kernels(capability=(12, 0))
def test_corrupt_switch_forces_the_fallback():
    """The corrupt switch on the 17..128 row: exactly one warning naming it, the row failed with the corruption in
    its detail, both nvfp4_linear calls on the W4A16 path (close to the weight-only reference, not W4A4's), the
    direct nvfp4_gemm on the reference kernel; the other row still checks and passes."""
    row = "nvfp4_sm120_128x128x256"
    out, stderr = _run("corrupt", BLOCKFP8_SELF_CHECK_CORRUPT=row)
    warnings = [line for line in stderr.splitlines() if "failed its first-use self-check" in line]
    assert len(warnings) == 1 and row in warnings[0] and "native NVFP4 GEMM" in warnings[0], stderr[-4000:]
    states = {s["name"]: s for s in out["states"]}
    assert states[row]["state"] == "failed" and "BLOCKFP8_SELF_CHECK_CORRUPT" in states[row]["detail"]
    assert states["nvfp4_sm120_128x128x128"]["state"] == "passed"


@needs_kernels(capability=(12, 0))
def test_every_row_passes():
    out, stderr = _run("plain")
    assert [s["state"] for s in out["states"]] == ["passed", "passed"], out
    assert "self-check" not in stderr


@needs_kernels(capability=(12, 0))
def test_capture_with_the_row_unchecked_takes_w4a16():
    """Inside a capture no check runs: the captured call is the W4A16 path and the row stays unchecked; the next
    eager call checks it."""
    out, _ = _run("capture")
    assert all(s["state"] == "unchecked" for s in out["after_capture"])
    assert all(s["state"] == "passed" for s in out["states"])


@needs_kernels()
def test_native_row_off_sm120_fails_its_check_cleanly():
    """On a GPU that cannot run the sm_120a rows, a row's check reports the CUDA error instead of crashing (a fresh
    process: a launch error must not leak into other tests)."""
    if not ops.nvfp4_native_rows():
        pytest.skip("this build has no sm_120a: no native rows")
    if tuple(torch.cuda.get_device_capability()) == (12, 0):
        pytest.skip("SM120 runs the rows: test_every_row_passes covers it")
    code = ("import torch; from vllm_blockfp8 import ops; print(repr(ops.nvfp4_self_check_run(0)));"
            "print(repr(ops.nvfp4_self_check_run(-1)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    row_line, ref_line = proc.stdout.strip().splitlines()[-2:]
    assert "CUDA error" in row_line, proc.stdout
    assert ref_line == "''", "the reference check must still pass after the row's failed launch"
