"""benchmarks/bench_sm89.py (issue 42 item 5): the dry run end to end (every variant at every point, floors from the
mma.sync peak, the summary lines, JSON and PNG), the --mma-peak reader, the variants ours builds, and on a GPU each
peer's and each forced SM89 row's output against the reference (the run on the H200: dev/device/h200_pending.sh).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from conftest import needs_kernels

from benchmarks import bench_sm89, harness, peers
from benchmarks.report import PUBLISHED_CEILINGS

CUDA = torch.cuda.is_available()
PEER_NAMES = {p.name for p in bench_sm89.SM89_PEERS}


def test_peers_are_vllm_triton_and_marlin_fp8():
    assert [p.name for p in bench_sm89.SM89_PEERS] == ["vllm_triton", "marlin_fp8"]
    assert bench_sm89.MARLIN_FP8.reference == "weight_only"  # W8A16: the activations stay bf16
    assert bench_sm89.MARLIN_FP8.rejects(1, 256, 1000) and bench_sm89.MARLIN_FP8.rejects(1, 256, 1024) is None


def test_mma_peak_reader(tmp_path):
    assert bench_sm89.read_mma_peak(None) == (None, "none given")
    assert bench_sm89.read_mma_peak("512.5")[0] == pytest.approx(512.5e12)
    line = {"probe": "mma_fp8_rate", "gpu": "H200", "arch": "sm_90a", "e4m3_tflops": 600.0, "e4m3_config": "w",
            "git": "abc"}
    f = tmp_path / "peak.json"
    f.write_text("the probe's table\n" + json.dumps(line) + "\n")
    flops, src = bench_sm89.read_mma_peak(str(f))
    assert flops == pytest.approx(600e12) and "H200" in src and str(f) in src
    for bad in ("{}", '{"e4m3_tflops": 0}', "not json"):
        f.write_text(bad)
        with pytest.raises(SystemExit):
            bench_sm89.read_mma_peak(str(f))
    with pytest.raises(SystemExit):
        bench_sm89.read_mma_peak(str(tmp_path / "missing.json"))


def test_dry_run_writes_every_variant_floor_and_summary(tmp_path, capsys):
    out_json, out_png = tmp_path / "s.json", tmp_path / "s.png"
    ms = [1, 16, 64, 1024, 8192]
    peak = 500.0
    assert bench_sm89.main(["--dry-run", "--quick", "--m", ",".join(map(str, ms)), "--mma-peak", str(peak),
                            "--json", str(out_json), "--plot", str(out_png)]) == 0
    data = json.loads(out_json.read_text())
    recs, skips = data["records"], data["skipped"]
    assert data["header"]["script"] == "bench_sm89" and data["header"]["dry_run"] is True
    notes = data["header"]["notes"]
    assert "500 TFLOP/s" in notes["floor"] and "gemm_table('sm89')" in notes["table"]
    shapes_run = harness.resolve_shapes("benchmark_set", quick=True)
    want = ({"ours", "ours@gemm_row0", "ours@gemm_row1", f"ours@{bench_sm89.DEQUANT_ROW}", bench_sm89.CEILING}
            | PEER_NAMES)
    points = {(s.name, m) for s in shapes_run for m in ms}
    for impl in want:  # timed, or skipped with a reason (the dry run skips some peers)
        assert {(r["shape"], r["m"]) for r in recs + skips if r["impl"] == impl} == points, impl
    ceil = PUBLISHED_CEILINGS.__class__(**{**PUBLISHED_CEILINGS.__dict__, "fp8_flops": peak * 1e12})
    by_shape = {s.name: s for s in shapes_run}
    for r in recs:
        s = by_shape[r["shape"]]
        floor, nbytes, flops = harness.linear_floor(ceil, r["m"], s.n, s.k)
        assert (r["floor_us"], r["bytes"], r["flops"]) == (pytest.approx(floor), nbytes, flops)
        if r["m"] == 8192:  # compute-bound: the floor is the mma.sync peak's
            assert r["floor_us"] == pytest.approx(flops / (peak * 1e12) * 1e6)
        if r["impl"] == "ours":  # the yardstick (our SM90 rows) is never a peer
            assert set(r["speedup"]) <= PEER_NAMES
    summary = notes["sm89_summary"]
    assert summary[0].startswith("compute ceiling of the floor: 500 TFLOP/s")
    assert any("of the mma.sync peak" in line and "prefill" in line for line in summary)
    assert any("of copy bandwidth" in line and "decode M = 1" in line for line in summary)
    text = capsys.readouterr().out
    assert all(line in text for line in summary + data["geomean"])
    if out_png.exists():  # matplotlib present
        assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_dry_run_without_a_peak_says_the_floor_is_not_the_mma_peak(tmp_path, capsys):
    out = tmp_path / "s.json"
    assert bench_sm89.main(["--dry-run", "--quick", "--m", "4096", "--rows", "none", "--peers", "none",
                            "--no-dequant", "--no-ceiling", "--json", str(out), "--plot", str(tmp_path / "p.png")]) == 0
    data = json.loads(out.read_text())
    assert {r["impl"] for r in data["records"]} == {"ours"}
    assert "NOT the mma.sync peak" in data["header"]["notes"]["floor"]
    assert "NOT the mma.sync peak" in capsys.readouterr().out


def _fake_ops(calls):
    rows = [dict(name="sm89_a", max_m=32, reason="r"), dict(name="sm89_b", max_m=None, reason="r")]
    state = {"table": "auto"}

    class Ops:
        @staticmethod
        def gemm_table(table):
            import contextlib

            @contextlib.contextmanager
            def ctx():
                was, state["table"] = state["table"], table
                yield
                state["table"] = was
            return ctx()

        @staticmethod
        def tile_table(family):
            return rows if (family, state["table"]) == ("gemm", "sm89") else []

        @staticmethod
        def selected_row(family, m, n, k):
            return {"linear": "w8a8_gemm", "gemm": f"{state['table']}_row"}[family]

        @staticmethod
        def blockfp8_linear(x, b, b_scale, row=None):
            calls.append(("linear", state["table"], row))

        @staticmethod
        def per_token_group_quant(x):
            calls.append(("quant", state["table"], None))
            return "q", "s"

        @staticmethod
        def blockfp8_gemm(q, s, b, b_scale, out_dtype, row=None):
            calls.append(("gemm", state["table"], row))
    return Ops


def test_our_variants_run_each_call_under_its_table():
    calls = []
    ops = _fake_ops(calls)
    args = SimpleNamespace(dry_run=False, rows="all", dequant=True, ceiling=True)
    copies = peers.LazyCopies(lambda i: SimpleNamespace(x="x", b="b", b_scale="s"))
    checker = peers.Checker(copies)
    got = bench_sm89.our_variants(args, ops, None, copies, checker, 64, 256, 512)
    assert [(v.impl, v.row) for v in got] == [
        ("ours", "w8a8_gemm:sm89_row"), ("ours@sm89_a", "sm89_a"), ("ours@sm89_b", "sm89_b"),
        (f"ours@{bench_sm89.DEQUANT_ROW}", bench_sm89.DEQUANT_ROW), (bench_sm89.CEILING, "w8a8_gemm:sm90_row")]
    assert all(not v.strict and v.check is not None for v in got)
    for v in got:
        v.factory(0)()
    assert calls == [("linear", "sm89", None), ("quant", "sm89", None), ("gemm", "sm89", "sm89_a"),
                     ("quant", "sm89", None), ("gemm", "sm89", "sm89_b"),
                     ("linear", "sm89", bench_sm89.DEQUANT_ROW), ("linear", "sm90", None)]
    args.rows = "sm89_b"
    assert [v.impl for v in bench_sm89.our_variants(args, ops, None, copies, checker, 64, 256, 512)][1] == "ours@sm89_b"
    args.rows = "nope"
    with pytest.raises(SystemExit, match="no SM89 row named nope"):
        bench_sm89.our_variants(args, ops, None, copies, checker, 64, 256, 512)
    missing = bench_sm89.our_variants(args, None, "extension not built", copies, checker, 1, 256, 512)
    assert [(v.impl, v.skip) for v in missing] == [("ours", "extension not built")]


@pytest.mark.skipif(CUDA, reason="CPU only: says why a GPU peer cannot run")
def test_peers_say_why_they_cannot_run_without_a_gpu():
    assert peers.probe(list(bench_sm89.SM89_PEERS), dry_run=False) == {
        p.name: f"no CUDA device [needs {p.needs}]" for p in bench_sm89.SM89_PEERS}


# ---- GPU -------------------------------------------------------------------------------------


def _operands(m, n, k):
    w = bench_sm89.Fp8Weight(n, k)
    return peers.LazyCopies(lambda i: bench_sm89.Sm89Operands(
        torch.randn(m, k, device="cuda", dtype=torch.bfloat16), w.b, w.b_scale, w=w))


@needs_kernels(extension=False)
@pytest.mark.parametrize("name", sorted(PEER_NAMES))
@pytest.mark.parametrize("m", [1, 5, 64, 1024])
def test_peer_output_matches_reference(name, m):
    """Each peer's call (vLLM's Marlin repack of the block scales included) on the same block-FP8 weight; N = 2112
    is not a multiple of 128 (a partial scale block, Marlin's N padding)."""
    peer = next(p for p in bench_sm89.SM89_PEERS if p.name == name)
    n, k = 2112, 1024
    why = peer.unavailable() or peer.rejects(m, n, k)
    if why:
        pytest.skip(why)
    copies = _operands(m, n, k)
    out = peer.build(copies[0], "linear")()
    assert out.shape == (m, n) and out.dtype == torch.bfloat16
    assert peers.Checker(copies).linear(peer.reference)(out) is None


@needs_kernels()
@pytest.mark.parametrize("m", [1, 16, 83, 1024])
def test_our_variants_match_reference_on_the_gpu(m):
    """ours, every forced SM89 row, dequantize + cuBLAS and the SM90 yardstick, as the benchmark calls them (each
    inside its table), held to the benchmark's own check."""
    ops, why = peers.our_ops()
    if why:
        pytest.skip(why)
    if not ops.gemm_table_rows("sm89"):
        pytest.skip("the build has no SM89 GEMM table (TORCH_CUDA_ARCH_LIST without 8.9)")
    if torch.cuda.get_device_capability() not in ((8, 9), (9, 0)):
        pytest.skip("the SM89 rows run on SM89 and SM90 only")
    n, k = 2112, 1024
    copies = _operands(m, n, k)
    args = SimpleNamespace(dry_run=False, rows="all", dequant=True,
                           ceiling=torch.cuda.get_device_capability() == (9, 0))
    variants = bench_sm89.our_variants(args, ops, None, copies, peers.Checker(copies), m, n, k)
    assert len(variants) == 1 + len(ops.gemm_table_rows("sm89")) + 1 + args.ceiling
    for v in variants:
        assert v.check(v.factory(0)()) is None, v.impl
