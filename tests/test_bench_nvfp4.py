"""benchmarks/bench_nvfp4.py (issue 40): the W4A16 floor, the dry run end to end (variants, floors,
geomean lines, JSON and PNG), forced rows, and the first-output check's tolerances against
emulations of each implementation's roundings (CPU); the peers' outputs on a GPU when one is present.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from conftest import needs_kernels

from benchmarks import bench_nvfp4, harness, peers, peers_fp4
from benchmarks.report import PUBLISHED_CEILINGS, band_of
from vllm_blockfp8 import reference

CUDA = torch.cuda.is_available()
needs_cuda = needs_kernels(extension=False)
PEER_NAMES = {p.name for p in peers_fp4.FP4_PEERS}


# ---- the floor -------------------------------------------------------------------------------


def test_nvfp4_floor_counts_packed_weight_scales_and_16_bit_activations():
    m, n, k = 1, 4096, 4096
    floor, nbytes, flops = harness.linear_floor(PUBLISHED_CEILINGS, m, n, k, weight="nvfp4")
    assert nbytes == n * k // 2 + n * k // 16 + 4 + 2 * m * k + 2 * m * n
    assert nbytes == harness.nvfp4_weight_bytes(n, k) + 2 * m * k + 2 * m * n
    assert flops == 2 * m * n * k
    assert floor == pytest.approx(nbytes / PUBLISHED_CEILINGS.copy_bytes_per_s * 1e6)
    # 0.5625 bytes a weight against FP8's ~1.0: the decode floor is ~0.56x the FP8 linear's.
    fp8 = harness.linear_floor(PUBLISHED_CEILINGS, m, n, k)[0]
    assert 0.55 < floor / fp8 < 0.58


def test_nvfp4_floor_is_the_bf16_peak_at_prefill():
    m = n = k = 8192
    floor, _, flops = harness.linear_floor(PUBLISHED_CEILINGS, m, n, k, weight="nvfp4")
    assert floor == pytest.approx(flops / PUBLISHED_CEILINGS.bf16_flops * 1e6)
    with pytest.raises(ValueError, match="weight-only"):
        harness.linear_floor(PUBLISHED_CEILINGS, m, n, k, weight="nvfp4", quantized_activations=True)
    with pytest.raises(ValueError, match="fp8 or nvfp4"):
        harness.linear_floor(PUBLISHED_CEILINGS, m, n, k, weight="int4")


# ---- the dry run -----------------------------------------------------------------------------


def test_dry_run_writes_every_variant_floor_and_geomean(tmp_path, capsys):
    out_json, out_png = tmp_path / "n.json", tmp_path / "n.png"
    ms = [1, 16, 256, 4096]
    assert bench_nvfp4.main(["--dry-run", "--quick", "--rows", "--m", ",".join(map(str, ms)),
                             "--json", str(out_json), "--plot", str(out_png)]) == 0
    data = json.loads(out_json.read_text())
    recs, skips = data["records"], data["skipped"]
    assert data["header"]["script"] == "bench_nvfp4" and data["header"]["dry_run"] is True
    assert "global_scale" in data["header"]["notes"]
    shapes_run = harness.resolve_shapes("benchmark_set", quick=True)
    want = {"ours", "ours@nvfp4_row0", "ours@nvfp4_row1", bench_nvfp4.FP8} | PEER_NAMES
    points = {(s.name, m) for s in shapes_run for m in ms}
    # Every variant at every point: timed, or skipped with a reason (the dry run skips some peers).
    for impl in want:
        seen = {(r["shape"], r["m"]) for r in recs + skips if r["impl"] == impl}
        assert seen == points, impl
    by_shape = {s.name: s for s in shapes_run}
    for r in recs:
        assert r["op"] == "nvfp4"
        s = by_shape[r["shape"]]
        floor, nbytes, flops = harness.linear_floor(PUBLISHED_CEILINGS, r["m"], s.n, s.k, weight="nvfp4")
        assert (r["floor_us"], r["bytes"], r["flops"]) == (pytest.approx(floor), nbytes, flops)
        if r["impl"] == "ours":
            # Our FP8 linear is shown beside the peers but is never what ours is compared with.
            assert set(r["speedup"]) <= PEER_NAMES
    bands = [band_of("nvfp4", m) for m in ms]
    assert [g.split("]")[0] + "]" for g in data["geomean"] if g.startswith("geomean [")] == [
        f"geomean [{b}]" for b in bands]
    assert bench_nvfp4.FP8 in data["geomean"][0] and "marlin_fp4" in data["geomean"][0]
    text = capsys.readouterr().out
    assert all(line in text for line in data["geomean"])
    if out_png.exists():  # matplotlib present
        assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_dry_run_defaults_write_outside_the_source_tree(tmp_path, monkeypatch):
    """Without --json / --plot a dry run writes to the temp directory, never benchmarks/results."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    before = set(harness.RESULTS_DIR.iterdir())
    assert bench_nvfp4.main(["--dry-run", "--quick", "--m", "1", "--peers", "none", "--no-fp8"]) == 0
    assert set(harness.RESULTS_DIR.iterdir()) == before
    data = json.loads((tmp_path / "blockfp8_bench" / "bench_nvfp4.dryrun.json").read_text())
    assert {r["impl"] for r in data["records"]} == {"ours"}


# ---- forced rows -----------------------------------------------------------------------------


def _args(**kw):
    return SimpleNamespace(**dict(dict(dry_run=False, rows="all", fp8=True), **kw))


def test_forced_rows_come_from_the_nvfp4_table_or_say_why_there_are_none():
    table = [dict(name="nvfp4_gemv_fma", max_m=16, reason="r"), dict(name="nvfp4_w4a16", max_m=0, reason="r")]
    ops = SimpleNamespace(tile_table=lambda family: table if family == "nvfp4" else [],
                          selected_row=lambda family, m, n, k: "nvfp4_gemv_fma")
    checker = peers_fp4.Fp4Checker(peers.LazyCopies(lambda i: None))
    got = bench_nvfp4.our_variants(_args(), ops, None, None, checker, 1, 256, 512)
    assert [(v.impl, v.row, v.skip) for v in got] == [
        ("ours", "nvfp4_gemv_fma", None), ("ours@nvfp4_gemv_fma", "nvfp4_gemv_fma", None),
        ("ours@nvfp4_w4a16", "nvfp4_w4a16", None)]
    assert all(not v.strict and v.check is not None for v in got)  # ours: timed and flagged

    def before_the_family(family):  # what ops.tile_table says before "nvfp4" is in ops.FAMILIES
        raise ValueError(f"family must be one of ('linear', 'gemv', 'gemm', 'quant'), got {family!r}")

    old = SimpleNamespace(tile_table=before_the_family, selected_row=lambda *a: before_the_family(a[0]))
    got = bench_nvfp4.our_variants(_args(), old, None, None, checker, 1, 256, 512)
    assert got[0].impl == "ours" and got[0].row == "? (ValueError)"
    assert got[1].impl == "ours@rows" and "no nvfp4 rows to force" in got[1].skip
    missing = bench_nvfp4.our_variants(_args(), None, "extension not built", None, checker, 1, 256, 512)
    assert [(v.impl, v.skip) for v in missing] == [("ours", "extension not built")]
    fp8 = bench_nvfp4.fp8_variants(_args(), None, "extension not built", None, 1, 256, 512)
    assert [(v.impl, v.skip) for v in fp8] == [(bench_nvfp4.FP8, "extension not built")]
    assert bench_nvfp4.fp8_variants(_args(fp8=False), None, "x", None, 1, 256, 512) == []


def test_rows_names_pick_forced_rows_and_an_unknown_name_stops_the_run():
    table = [dict(name="fp4_a", max_m=16, reason="r"), dict(name="fp4_dequant_cublas", max_m=None, reason="r")]
    ops = SimpleNamespace(tile_table=lambda family: table, selected_row=lambda family, m, n, k: "fp4_dequant_cublas")
    checker = peers_fp4.Fp4Checker(peers.LazyCopies(lambda i: None))
    got = bench_nvfp4.our_variants(_args(rows="fp4_dequant_cublas"), ops, None, None, checker, 2048, 256, 512)
    assert [(v.impl, v.row) for v in got] == [("ours", "fp4_dequant_cublas"),
                                              ("ours@fp4_dequant_cublas", "fp4_dequant_cublas")]
    with pytest.raises(SystemExit, match="no row fp4_b in the nvfp4 table"):
        bench_nvfp4.our_variants(_args(rows="fp4_a,fp4_b"), ops, None, None, checker, 1, 256, 512)


# ---- the first-output check (CPU emulations of each implementation's roundings) ----------------


@pytest.fixture(scope="module")
def fp4_point():
    torch.manual_seed(0)
    w = peers_fp4.Fp4Weight(512, 1024, device="cpu")
    x = torch.randn(peers.CHECK_ROWS, 1024, dtype=torch.bfloat16)
    return peers_fp4.Fp4Operands(x, w)


def _exact(o, packed=None, scale=None, gs=None):
    """x @ (e2m1 * scale)^T in fp32 (exact products, fp32 sums), times the global scale."""
    w = o.w
    wq = reference.dequantize_nvfp4(w.packed if packed is None else packed,
                                    w.scale if scale is None else scale, 1.0)
    return (o.x.float() @ wq.t()) * (w.global_scale if gs is None else gs)


def test_fp4_check_passes_each_implementations_roundings(fp4_point):
    o = fp4_point
    checker = peers_fp4.Fp4Checker(peers.LazyCopies(lambda i: o))
    bf16 = torch.bfloat16
    # ours: fp32 sum times the fp32 global scale, rounded once
    assert checker.linear("w4a16", tol=peers_fp4.FP4_OURS_TOL)(_exact(o).to(bf16)) is None
    # Marlin: the fp32 sum rounded to bf16, then times the bf16-rounded global scale in bf16
    marlin = (_exact(o, gs=1.0).to(bf16) * o.w.global_scale.to(bf16)).to(bf16)
    assert checker.linear("w4a16")(marlin) is None
    # cuBLAS: the weight with the global scale folded in, rounded to bf16, fp32 sums, one rounding
    assert checker.linear("w4a16")((o.x.float() @ o.w.bf16.float().t()).to(bf16)) is None


def test_fp4_check_fails_layout_and_scale_bugs(fp4_point):
    o = fp4_point
    check = peers_fp4.Fp4Checker(peers.LazyCopies(lambda i: o)).linear("w4a16")
    bf16 = torch.bfloat16
    swapped = (o.w.packed >> 4) | (o.w.packed << 4)          # high nibble taken as the even k
    lost = o.w.scale.clone()
    lost[:, 5] = 0                                             # one 16-value group per row lost
    for bad in (_exact(o, packed=swapped), _exact(o, gs=1.0), _exact(o, scale=lost),
                _exact(o, scale=o.w.scale.roll(1, dims=1))):
        why = check(bad.to(bf16))
        assert why is not None and "relative error" in why


def test_fp4_weight_forms_hold_the_same_numbers(fp4_point):
    w = fp4_point.w
    exact = reference.dequantize_nvfp4(w.packed, w.scale, w.global_scale)
    assert w.row_scale.shape == (w.n,) and torch.equal(w.row_scale, w.global_scale.expand(w.n))
    b, b_scale, packing = w.layer  # what ours reads, as the layer stores it
    if packing == "fragment":
        b, b_scale = reference.unfragment_nvfp4_weight(b, b_scale)
        assert torch.equal(reference.dequantize_nvfp4(b, b_scale, w.global_scale), exact)
    else:
        assert packing == "paired" and torch.equal(reference.unpair_nvfp4_weight(b), w.packed)
    assert torch.equal(w.bf16, exact.to(torch.bfloat16))
    # Without the global scale the weight is exact in bf16: the claim the tolerances rest on.
    plain = reference.dequantize_nvfp4(w.packed, w.scale, 1.0)
    assert torch.equal(plain.to(torch.bfloat16).float(), plain)
    b, bs = w.fp8
    rel = ((reference.dequantize_block_fp8(b, bs) - exact).norm() / exact.norm()).item()
    assert rel < 0.05  # e4m3 rounding of the same weight


@pytest.mark.skipif(CUDA, reason="CPU only: says why a GPU peer cannot run")
def test_fp4_peers_say_why_they_cannot_run_without_a_gpu():
    assert peers.probe(list(peers_fp4.FP4_PEERS), dry_run=False) == {
        p.name: f"no CUDA device [needs {p.needs}]" for p in peers_fp4.FP4_PEERS}
    assert all(p.rejects(1, 256, 1000) and p.rejects(1, 256, 1024) is None for p in peers_fp4.FP4_PEERS)


# ---- GPU -------------------------------------------------------------------------------------


@needs_cuda
@pytest.mark.parametrize("name", sorted(PEER_NAMES))
@pytest.mark.parametrize("m", [1, 5, 64, 1024])
def test_fp4_peer_output_matches_reference(name, m):
    """Each peer's call (vLLM's Marlin repack and apply included) on the same NVFP4 weight."""
    peer = next(p for p in peers_fp4.FP4_PEERS if p.name == name)
    n, k = 2112, 1024
    why = peer.unavailable() or peer.rejects(m, n, k)
    if why:
        pytest.skip(why)
    copies = peers.LazyCopies(lambda i: peers_fp4.Fp4Operands(
        torch.randn(m, k, device="cuda", dtype=torch.bfloat16), peers_fp4.Fp4Weight(n, k)))
    out = peer.build(copies[0], "nvfp4")()
    assert out.shape == (m, n) and out.dtype == torch.bfloat16
    assert peers_fp4.Fp4Checker(copies).linear(peer.reference)(out) is None


@needs_cuda
@pytest.mark.parametrize("m", [1, 16, 128, 1024])
def test_ours_meets_the_fp4_tolerance_the_benchmark_flags_at(m):
    ops, why = peers.our_ops()
    if why:
        pytest.skip(why)
    n, k = 2112, 1024
    o = peers_fp4.Fp4Operands(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), peers_fp4.Fp4Weight(n, k))
    out = ops.nvfp4_linear(o.x, o.w.layer[0], o.w.layer[1], o.w.row_scale, packing=o.w.layer[2])
    check = peers_fp4.Fp4Checker(peers.LazyCopies(lambda i: o)).linear("w4a16", tol=peers_fp4.FP4_OURS_TOL)
    assert check(out) is None
