"""The benchmark harness: floors, records, table, geomean lines, JSON, plot (CPU, fake records);
operand layouts for the peers; our Triton GEMM under Triton's interpreter (CPU); graph timing, the
ceilings, the Triton GEMM and the torch._scaled_mm block-scaled call on a GPU when one is present.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from conftest import needs_kernels

from benchmarks import bench_gemv, bench_quant, harness, held_out_shapes, peers, triton_gemm
from benchmarks.report import PUBLISHED_CEILINGS, Record, Report, band_of, geomean
from vllm_blockfp8 import reference, shapes

ROOT = Path(__file__).resolve().parent.parent
CUDA = torch.cuda.is_available()
needs_cuda = needs_kernels(extension=False)
needs_sm90 = needs_kernels(capability=(9, 0), extension=False)


def rel_err(out, ref) -> float:
    assert torch.isfinite(out).all()
    return (torch.linalg.vector_norm(out.double() - ref) / torch.linalg.vector_norm(ref)).item()


# One bf16 rounding is ~2^-9 / sqrt(3) in norm; FP8 tensor-core accumulation inside a 128-wide
# block adds a little. A wrong scale layout costs ~10%.
GPU_TOL = 4e-3


def rec(impl, shape="s", m=1, us=10.0, floor=5.0, op="linear", **kw):
    return Record(op=op, impl=impl, shape=shape, m=m, n=4096, k=4096, us=us, floor_us=floor,
                  bytes=1_000_000, flops=2 * m * 4096 * 4096, **kw)


def fake_report(records) -> Report:
    report = Report(script="t", ceilings=PUBLISHED_CEILINGS, replays=20, dry_run=True)
    report.records.extend(records)
    return report


# ---- floors ----------------------------------------------------------------------------------


def test_linear_floor_memory_bound_counts_every_byte():
    m, n, k = 1, 4096, 4096
    floor, nbytes, flops = harness.linear_floor(PUBLISHED_CEILINGS, m, n, k)
    expected = n * k + 4 * 32 * 32 + 2 * m * k + 2 * m * n
    assert nbytes == expected
    assert flops == 2 * m * n * k
    assert floor == pytest.approx(expected / PUBLISHED_CEILINGS.copy_bytes_per_s * 1e6)


def test_linear_floor_gemm_only_counts_fp8_activations_and_scales():
    m, n, k = 64, 2048, 7168
    _, nbytes, _ = harness.linear_floor(PUBLISHED_CEILINGS, m, n, k, quantized_activations=True)
    assert nbytes == n * k + 4 * 16 * 56 + m * k + 4 * m * 56 + 2 * m * n


def test_linear_floor_compute_bound_at_prefill():
    m = n = k = 8192
    floor, _, flops = harness.linear_floor(PUBLISHED_CEILINGS, m, n, k)
    assert floor == pytest.approx(flops / PUBLISHED_CEILINGS.fp8_flops * 1e6)


def test_quant_floor():
    floor, nbytes, _ = harness.quant_floor(PUBLISHED_CEILINGS, 1024, 4096)
    assert nbytes == 2 * 1024 * 4096 + 1024 * 4096 + 4 * 1024 * 32
    assert floor == pytest.approx(nbytes / 4.12e12 * 1e6)


def test_copies_cover_the_rotation_bytes():
    assert harness.copies_for(6144 * 4096) * 6144 * 4096 >= harness.MIN_ROTATION_BYTES
    assert harness.copies_for(1 << 40) == 2
    assert harness.copies_for(1) == harness.MAX_COPIES


# ---- records, bands, table, geomean ------------------------------------------------------------


def test_record_derived_numbers():
    r = rec("ours", m=8, us=4.0, floor=2.0)
    assert r.ratio == 2.0
    assert r.gbps == pytest.approx(1_000_000 / 4.0 / 1e3)
    assert r.tflops == pytest.approx(2 * 8 * 4096 * 4096 / 4.0 / 1e6)


@pytest.mark.parametrize("op,m,band", [
    ("linear", 1, "full linear, decode M = 1"),
    ("linear", 16, "full linear, spec decode M = 2..16"),
    ("gemm", 32, "GEMM only, mid M = 32..256"), ("gemm", 8192, "GEMM only, prefill M = 1024..8192"),
    ("quant", 1024, "quantizer, M >= 1024"), ("quant", 128, "quantizer, M < 1024")])
def test_bands(op, m, band):
    assert band_of(op, m) == band


def test_geomean_and_speedups():
    assert geomean([1.0, 4.0]) == pytest.approx(2.0)
    report = fake_report([rec("ours", us=10), rec("bf16", us=30), rec("vllm", us=20)])
    assert report.speedups(report.records[0]) == {"bf16": 3.0, "vllm": 2.0}


def test_a_yardstick_is_shown_but_never_the_best_peer():
    """A same-bytes yardstick (e.g. a plain cast beside the quantizer) gets its column and its
    geomean, but speedups and "best peer" compare against real peers only, even when it is faster."""
    report = fake_report([rec("ours", us=10), rec("vllm", us=20), rec("yardstick:cast", us=5)])
    assert report.speedups(report.records[0]) == {"vllm": 2.0}
    lines = report.table().splitlines()
    assert "yardstick:cast us" in lines[0]
    cells = lines[2].split()
    assert "5.00" in cells and cells[-3:] == ["vllm", "4.00x", "2.00x"]
    head = report.geomean_lines()[0]
    assert "best peer 4.00x" in head and "yardstick:cast 1.00x" in head


def test_table_is_aligned_and_geomean_lines_follow_bands():
    records = []
    for shape, ours_us in (("a", 6.0), ("b", 12.0)):
        for m in (1, 4):
            records += [rec("ours", shape, m, ours_us, row="r0"),
                        rec("ours@r1", shape, m, ours_us * 2, row="r1"),
                        rec("bf16", shape, m, 30.0), rec("vllm", shape, m, 20.0)]
    report = fake_report(records + [rec("bf16", "c", 1, 30.0)])   # a point with no ours
    lines = report.table().splitlines()
    assert len({len(line) for line in lines}) == 1
    assert len(lines) == 2 + 2 * 4 + 1
    assert "bf16 us" in lines[0] and "vllm us" in lines[0]
    geo = report.geomean_lines()
    heads = [g for g in geo if g.startswith("geomean [")]
    assert [h.split("]")[0] for h in heads] == ["geomean [full linear, decode M = 1",
                                                 "geomean [full linear, spec decode M = 2..16"]
    # decode band: ours 6 and 12 us over a 5 us floor -> geomean sqrt(1.2 * 2.4)
    assert f"ours {math.sqrt(1.2 * 2.4):.2f}x floor" in heads[0]
    # vllm (20 us) is best wherever ours ran; bf16 (30 us) alone at point c
    assert f"best peer {geomean([4.0, 4.0, 6.0]):.2f}x (worst 6.00x)" in heads[0]
    assert any(g.startswith("    ours@r1") for g in geo)


def test_json_has_header_records_speedups_and_skips(tmp_path):
    report = fake_report([rec("ours", row="r0"), rec("bf16", us=25.0)])
    report.skip("linear", "deepgemm", "s", 1, "not installed")
    path = tmp_path / "out.json"
    report.write_json(path)
    data = json.loads(path.read_text())
    for key in ("gpu", "torch", "cuda", "triton", "git", "date", "ceilings"):
        assert key in data["header"]
    ours = data["records"][0]
    for key in ("op", "row", "shape", "m", "n", "k", "us", "gbps", "tflops", "ratio", "band"):
        assert key in ours
    assert ours["speedup"] == {"bf16": 2.5}
    assert data["skipped"][0]["reason"] == "not installed"


def test_json_gz_path_is_compressed_and_holds_the_same_json(tmp_path):
    report = fake_report([rec("ours", row="r0"), rec("bf16", us=25.0)])
    report.write_json(tmp_path / "out.json")
    report.write_json(tmp_path / "out.json.gz")
    packed = (tmp_path / "out.json.gz").read_bytes()
    assert packed[:2] == b"\x1f\x8b"
    plain, unpacked = (json.loads(t) for t in ((tmp_path / "out.json").read_text(), gzip.decompress(packed)))
    for data in (plain, unpacked):
        data["header"].pop("date", None)
    assert plain == unpacked


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    report = fake_report([rec("ours", m=m, us=6.0 + m) for m in (1, 2, 4)]
                         + [rec("bf16", m=m, us=20.0) for m in (1, 2, 4)])
    path = tmp_path / "p.png"
    assert report.plot(path) is None
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- command line and the dry run ------------------------------------------------------------


def test_shape_and_m_parsing():
    picked = harness.resolve_shapes("qwen3_8b,dsv3.2112x7168")
    assert [s.name for s in picked] == [s.name for s in shapes.QWEN3_8B] + ["dsv3.2112x7168"]
    assert len(harness.resolve_shapes("benchmark_set")) == 15
    assert len(harness.resolve_shapes("benchmark_set", quick=True)) == len(harness.QUICK_SHAPES)
    assert harness.parse_m("1,2, 4") == [1, 2, 4]
    assert bench_quant.k_values("K=4096,7168,qwen3-8b.down", False) == [4096, 7168, 12288]
    assert harness.resolve_shapes("7168x12288") == [shapes.WeightShape("7168x12288", 7168, 12288)]
    assert harness.resolve_shapes("held_out_7") == list(held_out_shapes.HELD_OUT_7)
    narrow = harness.resolve_shapes("narrow_long_k")
    assert [(s.n, s.k) for s in narrow] == [(576, 7168), (1024, 7168), (512, 7168), (1536, 4096), (768, 4096),
                                            (1280, 8192)]
    assert all(s.n <= 1536 and s.k >= 4096 for s in narrow)
    assert harness.resolve_shapes("gpt2.qkv.2304x768,qwen3-8b.o") == [
        shapes.WeightShape("gpt2.qkv.2304x768", 2304, 768), shapes.by_name("qwen3-8b.o")]
    for bad in ("nope", "7168x", "0x128", "7168x12288x2"):
        with pytest.raises(SystemExit):
            harness.resolve_shapes(bad)


def test_dry_run_prints_table_last_then_geomeans(tmp_path, capsys):
    out_json, out_png = tmp_path / "g.json", tmp_path / "g.png"
    t0 = time.time()
    assert bench_gemv.main(["--dry-run", "--quick", "--rows", "--m", "1,4",
                            "--json", str(out_json), "--plot", str(out_png)]) == 0
    text = capsys.readouterr().out.rstrip().splitlines()
    geo_start = next(i for i, line in enumerate(text) if line.startswith("geomean ["))
    assert all(line.startswith(("geomean [", "    ours@")) for line in text[geo_start:])
    assert text[geo_start - 1] == "" and text[geo_start - 2].startswith("linear")
    data = json.loads(out_json.read_text())
    assert data["header"]["dry_run"] is True and data["records"]
    assert any(r["impl"].startswith("ours@") for r in data["records"])
    # Each record says when its timing ended (to be joined with h200_check's clock logs), in order.
    ends = [r["end_unix"] for r in data["records"]]
    assert t0 <= ends[0] and ends == sorted(ends) and ends[-1] <= time.time()



@pytest.mark.parametrize("timing", harness.TIMINGS)
def test_timing_mode_is_recorded_and_a_bad_one_is_refused(tmp_path, monkeypatch, timing):
    out_json = tmp_path / "g.json"
    monkeypatch.setenv("BENCH_TIMING", timing)
    assert bench_gemv.main(["--dry-run", "--quick", "--m", "1", "--json", str(out_json),
                            "--plot", str(tmp_path / "g.png")]) == 0
    data = json.loads(out_json.read_text())
    assert data["header"]["args"]["timing"] == timing and data["records"]
    monkeypatch.setenv("BENCH_TIMING", "bogus")
    with pytest.raises(SystemExit, match="timing must be one of"):
        bench_gemv.main(["--dry-run", "--quick", "--m", "1", "--json", str(out_json)])


def test_time_budget_stops_new_points_and_still_writes_the_report(tmp_path, monkeypatch):
    """A spent budget (from the flag or BENCH_TIME_BUDGET_S) measures nothing more but still
    writes the JSON, listing every point it left out."""
    out_json = tmp_path / "g.json"
    monkeypatch.setenv("BENCH_TIME_BUDGET_S", "0")
    assert bench_gemv.main(["--dry-run", "--quick", "--m", "1,4", "--json", str(out_json),
                            "--plot", str(tmp_path / "g.png")]) == 0
    data = json.loads(out_json.read_text())
    assert not data["records"]
    left = data["header"]["notes"]["not_measured"]
    assert len(left) == 2 * len(harness.resolve_shapes("benchmark_set", quick=True)), left
    monkeypatch.delenv("BENCH_TIME_BUDGET_S")
    assert bench_gemv.main(["--dry-run", "--quick", "--m", "1", "--time-budget-s", "600",
                            "--json", str(out_json), "--plot", str(tmp_path / "g.png")]) == 0
    data = json.loads(out_json.read_text())
    assert data["records"] and "not_measured" not in data["header"]["notes"]


# ---- peers' operand layouts (CPU) ----------------------------------------------------------


def test_m_major_scales_have_the_padded_stride():
    s = torch.rand(5, 3) + 0.5
    mm = peers.m_major(s, 8)
    assert mm.shape == (8, 3) and mm.stride() == (1, 8)
    assert torch.equal(mm[:5], s) and torch.equal(mm[5:], s[:1].expand(3, 3))


def test_pad_rows_keeps_fp8_bytes():
    t = torch.randn(3, 32).to(torch.float8_e4m3fn)
    p = peers.pad_rows(t, 4)
    assert p.dtype == t.dtype and p.shape == (4, 32) and p.is_contiguous()
    assert torch.equal(p[:3].view(torch.uint8), t.view(torch.uint8))
    assert torch.equal(p[3].view(torch.uint8), t[0].view(torch.uint8))


def test_peer_selection():
    assert [p.name for p in peers.select(peers.GEMM_PEERS, "bf16,cublaslt")] == ["bf16", "cublaslt"]
    assert peers.select(peers.GEMM_PEERS, "none") == []
    with pytest.raises(SystemExit):
        peers.select(peers.GEMM_PEERS, "cutlass2")


def test_triton_configs():
    assert triton_gemm.config_for(1, 6144, 132).block_n == 32        # 96 tiles < 132 SMs
    assert triton_gemm.config_for(1, 24576, 132).block_n == 64
    assert triton_gemm.config_for(8192, 4096, 132).block_m == 128
    assert triton_gemm.rejects(1, 1024, 3884)
    assert triton_gemm.rejects(1, 1024, 4096) is None


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="GPU machines check the compiled kernel (test_triton_gemm_matches_reference); the "
                           "interpreter failed there on the H200 image's numpy (2026-11-29)")
def test_triton_gemm_under_the_interpreter():
    """The kernel's math on CPU: fp32 output (the interpreter truncates fp32 -> bf16), ragged M/N,
    M-major padded scales, every config. fp32 accumulation in another order: ~1e-7 relative."""
    script = textwrap.dedent("""
        import torch
        from benchmarks import triton_gemm as tg
        from vllm_blockfp8 import reference as ref
        torch.manual_seed(0)
        cases = [(3, 200, 384, tg.CONFIGS[0]), (37, 256, 256, tg.CONFIGS[1]),
                 (70, 384, 512, tg.CONFIGS[2]), (130, 200, 256, tg.CONFIGS[3]),
                 (5, 320, 256, tg.config_for(5, 320, 132))]
        for m, n, k, cfg in cases:
            a, s = ref.quantize_per_token_group(torch.randn(m, k))
            b, bs = ref.quantize_block_fp8(torch.randn(n, k))
            m4 = -(-m // 4) * 4
            buf = torch.full((k // 128, m4), 3.0)
            buf[:, :m] = s.t()
            sa = buf[:, :m].t()
            out = tg.block_fp8_gemm(a, sa, b, bs, out_dtype=torch.float32, config=cfg)
            r = ref.gemm_ref(a, sa, b, bs)
            rel = ((out.double() - r).norm() / r.norm()).item()
            assert rel < 1e-6, (m, n, k, cfg, rel)
        print("ok")
    """)
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


# ---- GPU -------------------------------------------------------------------------------------


@needs_cuda
def test_time_graph_per_call_time_scales_with_work():
    small = torch.empty(1 << 26, dtype=torch.uint8, device="cuda")
    big = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    t_small = harness.time_graph(lambda i: (lambda: small.add_(1)), 4)
    t_big = harness.time_graph(lambda i: (lambda: big.add_(1)), 4)
    assert t_small.method == t_big.method == "graph" and t_small.copies == 4
    assert 2.0 < t_big.us / t_small.us < 6.0


@needs_cuda
def test_time_prepared_interleaves_and_keeps_each_graphs_time():
    """Two graphs timed in turns keep their own per-call times (4x the bytes: ~4x the time), in the
    order given; a graph timed alone and in turns agree."""
    small = torch.empty(1 << 26, dtype=torch.uint8, device="cuda")
    big = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    graphs = [harness.prepare_graph(lambda i: (lambda: big.add_(1)), 4),
              harness.prepare_graph(lambda i: (lambda: small.add_(1)), 4)]
    t_big, t_small = harness.time_prepared(graphs, replays=10)
    assert t_big.copies == t_small.copies == 4 and t_big.replays == 10
    assert 2.0 < t_big.us / t_small.us < 6.0
    alone = harness.time_graph(lambda i: (lambda: big.add_(1)), 4, replays=10)
    assert 0.8 < alone.us / t_big.us < 1.25


@needs_cuda
@pytest.mark.parametrize("timing", harness.TIMINGS)
def test_runner_point_times_every_variant_and_skips_only_the_failing_one(timing):
    x = torch.ones(1 << 20, device="cuda")

    def broken(i):
        raise RuntimeError("no kernel for this shape")

    report = Report(script="t", ceilings=PUBLISHED_CEILINGS, replays=5, dry_run=False, argv={})
    runner = harness.Runner(report=report, replays=5, dry_run=False, timing=timing)
    runner.point(op="gemm", shape="s", m=1, n=8, k=128, floor=(1.0, 1, 1), copies=2, variants=[
        harness.Variant("ours", factory=lambda i: (lambda: x.add_(1))),
        harness.Variant("cublaslt", factory=broken),
        harness.Variant("deepgemm", skip="not installed"),
        harness.Variant("triton", factory=lambda i: (lambda: x.mul_(1.0)))])
    assert [r.impl for r in report.records] == ["ours", "triton"]
    assert all(r.us > 0 and r.method == "graph" and r.replays == 5 for r in report.records)
    reasons = {s["impl"]: s["reason"] for s in report.skips}
    assert reasons == {"cublaslt": "RuntimeError: no kernel for this shape", "deepgemm": "not installed"}


@needs_cuda
def test_time_graph_check_rejects_a_wrong_first_output():
    x = torch.ones(16, device="cuda")
    with pytest.raises(harness.WrongResult):
        harness.time_graph(lambda i: (lambda: x * 2), 2, check=lambda out: "wrong")


@needs_cuda
def test_ceilings_are_plausible():
    c = harness.measure_ceilings(replays=5)
    assert 1e12 < c.copy_bytes_per_s < 1e13
    assert 1e14 < c.bf16_flops < c.fp8_flops < 5e15
    assert 0.1 < c.graph_node_us < 20


@needs_cuda
@pytest.mark.parametrize("m", [1, 7, 83, 300])
@pytest.mark.parametrize("n,k", [(2112, 1024), (576, 7168), (4096, 512)])
def test_triton_gemm_matches_reference(m, n, k):
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    a, s = reference.quantize_per_token_group(x)
    b, bs = reference.quantize_block_fp8(torch.randn(n, k, device="cuda"))
    sa = peers.m_major(s, peers.round_up(m, 4))[:m]  # [M, K/128] with strides (1, round_up(M, 4))
    out = triton_gemm.block_fp8_gemm(a, sa, b, bs)
    assert out.dtype == torch.bfloat16
    assert rel_err(out, reference.gemm_ref(a, sa, b, bs)) < GPU_TOL


@pytest.mark.parametrize("m", [1, 5, 64])
def test_peer_check_separates_layout_bugs_from_quantizer_rounding(m):
    """CPU: the peer output check passes the w8a8 reference itself and an output whose activations
    differ from the reference quantizer's by one e4m3 code at a group's largest element (what a
    different but correct quantizer may do), and fails the classic layout bug (each K group
    multiplied by its neighbour's activation scale)."""
    torch.manual_seed(m)
    copies = peers.LazyCopies(lambda i: peers.make_operands(m, 2048, 1024, gemm_inputs=True, device="cpu"))
    o, check = copies[0], peers.Checker(copies).linear("w8a8")
    a, s = reference.quantize_per_token_group(o.x)
    assert check(reference.gemm_ref(a, s, o.b, o.b_scale).to(torch.bfloat16)) is None
    codes = a.view(torch.uint8).clone()
    top = a.float().abs().argmax(dim=1)
    codes[torch.arange(m), top] -= 1  # each row's largest element one e4m3 code closer to zero (0.6-0.7%)
    neighbour = codes.view(torch.float8_e4m3fn)
    assert check(reference.gemm_ref(neighbour, s, o.b, o.b_scale).to(torch.bfloat16)) is None
    wrong = check(reference.gemm_ref(a, s.roll(1, dims=1), o.b, o.b_scale).to(torch.bfloat16))
    assert wrong is not None and "relative error" in wrong


@needs_cuda
@pytest.mark.parametrize("name", [p.name for p in peers.GEMM_PEERS])
@pytest.mark.parametrize("mode", ["linear", "gemm"])
@pytest.mark.parametrize("m", [1, 5, 64])
def test_peer_output_matches_reference(name, mode, m):
    """Checks every peer's call (torch._scaled_mm block scales included) where it is available."""
    peer = next(p for p in peers.GEMM_PEERS if p.name == name)
    n, k = 2048, 1024
    why = peer.unavailable() or peer.rejects(m, n, k)
    if why:
        pytest.skip(why)
    copies = peers.LazyCopies(lambda i: peers.make_operands(m, n, k, gemm_inputs=mode == "gemm"))
    out = peer.build(copies[0], mode)()
    assert out.shape == (m, n)
    assert peers.Checker(copies).linear(peer.reference)(out) is None


@needs_sm90
def test_scaled_mm_block_call_matches_reference():
    m, n, k = 5, 256, 512
    o = peers.make_operands(m, n, k, gemm_inputs=True)
    run = next(p for p in peers.GEMM_PEERS if p.name == "cublaslt").build(o, "gemm")
    assert rel_err(run(), reference.gemm_ref(o.a, o.a_scale, o.b, o.b_scale)) < GPU_TOL


def test_merge_bench_fills_missing_points_and_replaces_only_on_request():
    """benchmarks/analysis/merge_bench.merge: SECOND's records fill the points FIRST lacks; with
    replace=True they also displace FIRST's at shared points (listed in header["replaced"]); merges
    chain their headers."""
    from benchmarks.analysis import merge_bench

    def run(tag, points):
        recs = [dict(op="gemm", impl=impl, shape=s, m=m, us=us) for s, m, us in points for impl in ("ours", "cublaslt")]
        return dict(header=dict(run=tag), records=recs, skipped=[dict(op="gemm", shape="late", m=1, why="time")])

    first = run("a", [("x", 32, 1.0), ("y", 32, 2.0)])
    second = run("b", [("y", 32, 3.0), ("z", 64, 4.0)])
    filled = merge_bench.merge(first, second)
    got = {(r["shape"], r["m"], r["impl"]): r["us"] for r in filled["records"]}
    assert got == {("x", 32, "ours"): 1.0, ("x", 32, "cublaslt"): 1.0, ("y", 32, "ours"): 2.0,
                   ("y", 32, "cublaslt"): 2.0, ("z", 64, "ours"): 4.0, ("z", 64, "cublaslt"): 4.0}
    assert "replaced" not in filled["header"] and filled["header"]["continued_by"] == [dict(run="b")]
    swapped = merge_bench.merge(filled, run("c", [("x", 32, 5.0)]), replace=True)
    got = {(r["shape"], r["m"], r["impl"]): r["us"] for r in swapped["records"]}
    assert got[("x", 32, "ours")] == 5.0 and got[("y", 32, "ours")] == 2.0 and len(got) == 6
    assert swapped["header"]["replaced"] == [["gemm", "x", 32]]
    assert [h["run"] for h in swapped["header"]["continued_by"]] == ["b", "c"]


def test_under_table_applies_the_table_once_before_the_variants_first_callable():
    from vllm_blockfp8.tools.harness import under_table

    applied, made = [], []
    factory = under_table(applied.append, ["entry"], lambda i: made.append(i) or (lambda: i))
    assert applied == [] and made == []  # nothing happens until prepare_graph asks
    fns = [factory(i) for i in range(3)]
    assert applied == [["entry"]] and made == [0, 1, 2] and [f() for f in fns] == [0, 1, 2]
