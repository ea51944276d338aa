"""CPU tests of benchmarks/bench_tune_ab.py: the dry run end to end on a tiny fake checkpoint, the verdict with
synthetic timings, and the GPU timing path (harness.Runner, interleaved) with the graph calls faked on the CPU, to
show that each variant's graph is captured with its own tuned table in force."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import bench_tune_ab as ab
from benchmarks import harness
from benchmarks.report import PUBLISHED_CEILINGS, Record, Report
from vllm_blockfp8 import cli, reference, tuning
from vllm_blockfp8.tools import tune

from test_tune import KEY, _fp8_checkpoint


def _dry_tuned(tmp_path, m="1,16,64"):
    model = _fp8_checkpoint(tmp_path / "m")
    assert cli.main(["tune", str(model), "--dry-run", "--no-progress", "--m", m]) == 0
    return model


def test_dry_run_end_to_end(tmp_path, capsys):
    model = _dry_tuned(tmp_path)
    capsys.readouterr()
    out_json, out_png = tmp_path / "ab.json", tmp_path / "ab.png"
    rc = ab.main([str(model), "--dry-run", "--shapes", "qwen3_8b", "--json", str(out_json), "--plot", str(out_png)])
    text = capsys.readouterr().out
    assert rc == 0, text
    doc = json.loads(out_json.read_text())
    tuned_doc = json.loads((model / tuning.FILE_NAME).read_text())
    s = doc["header"]["notes"]["tune_ab"]
    # (a) the file's 4 shapes x 3 buckets, (b) Qwen3-8B's 4 shapes at the file's buckets.
    assert s["points"] == 4 * 3 + 4 * 3 and s["tuned_points"] == 12 and s["not_measured"] == 0
    assert s["overridden"] == len(tuned_doc["overrides"]) > 0 and s["passed"]
    assert {r["impl"] for r in doc["records"]} == set(ab.ORDER)
    assert doc["header"]["notes"]["overrides"] == tuning.parse((model / tuning.FILE_NAME).read_text(), None)
    first = [r["shape"] for r in doc["records"][:3]]
    assert first == [first[0]] * 3 and doc["records"][0]["impl"] == ab.PLANNER  # the order: planner, tuned, again
    assert out_png.exists() and (tmp_path / "ab_ratio.png").exists()
    lines = [x for x in text.splitlines() if x.startswith("tune_ab:")]
    assert lines[-1] == "tune_ab: PASS" and "target <= 1.01: met" in text and "wins where the planner misses" in text
    assert text.rstrip().splitlines()[-1] == "tune_ab: PASS"  # the summary comes last


def test_the_file_must_load(tmp_path):
    model = _dry_tuned(tmp_path)
    path = model / tuning.FILE_NAME
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "version": 0}))
    with pytest.raises(SystemExit, match="the loader ignores this tuned file here: version 0"):
        ab.main([str(path), "--dry-run", "--shapes", "none"])
    with pytest.raises(SystemExit, match="cannot read a tuned file"):
        ab.main([str(tmp_path / "missing.json"), "--dry-run"])


def test_format_from_the_file():
    assert ab.file_format({"measurements": [{"family": "gemv"}, {"family": "gemm"}]}, "auto") == "fp8-block"
    assert ab.file_format({"measurements": [{"family": "nvfp4"}]}, "auto") == "nvfp4"
    assert ab.file_format({"measurements": []}, "nvfp4") == "nvfp4"
    with pytest.raises(SystemExit, match="pass --format"):
        ab.file_format({"measurements": []}, "auto")
    with pytest.raises(SystemExit, match="--format nvfp4, but"):
        ab.file_format({"measurements": [{"family": "gemv"}]}, "nvfp4")


def test_nvfp4_dry_run(tmp_path, capsys):
    meas = [{"family": "nvfp4", "n": 512, "k": 256, "m": m, "m_min": lo, "m_max": m, "default_row": "nvfp4_row0",
             "times_us": {"nvfp4_row0": 10.0, "nvfp4_row1": 9.0 if m == 16 else 11.0}} for lo, m in ((1, 1), (2, 16))]
    path = tmp_path / "t.json"
    tuning.write(path, tuning.document(KEY, meas, (1, 16)))
    assert ab.main([str(path), "--dry-run", "--shapes", "none", "--json", str(tmp_path / "a.json"),
                    "--plot", str(tmp_path / "a.png")]) == 0
    doc = json.loads((tmp_path / "a.json").read_text())
    assert {r["op"] for r in doc["records"]} == {"nvfp4"}
    s = doc["header"]["notes"]["tune_ab"]
    assert s["points"] == 2 and s["overridden"] == 1 and [r["m"] for r in s["wins"]] == [16]


# ------------------------------------------------------------------------------------------------
# The verdict
# ------------------------------------------------------------------------------------------------


def _records(points, times):
    """Records of (planner, tuned, again) microseconds per point."""
    out = []
    for p, ts in zip(points, times):
        for impl, us in zip(ab.ORDER, ts):
            out.append(Record(op="linear", impl=impl, shape=p.shape, m=p.m, n=p.n, k=p.k, us=us, floor_us=1.0,
                              bytes=1, flops=1))
    return out


def _p(m, override=None, tuned_point=True, planner="r0"):
    return ab.Point(shape="s", n=256, k=256, m=m, tuned_point=tuned_point, family="gemm", planner_row=planner,
                    override=override, gain=0.05 if override else None)


def test_noise_is_the_planner_against_itself():
    assert ab.nearest_rank([0.1, 0.3, 0.2], 0.95) == 0.3 and ab.nearest_rank([], 0.95) is None
    assert ab.nearest_rank([i / 100 for i in range(1, 41)], 0.95) == 0.38  # rank ceil(0.95 * 40) = 38
    points = [_p(m) for m in range(1, 21)]
    # Planner pairs differ by 0.1% .. 2.0%: p95 of 20 samples is the 19th, 1.9%.
    times = [(10.0, 10.0, 10.0 * (1 + m / 1000)) for m in range(1, 21)]
    s = ab.summarize(points, _records(points, times))
    assert s["noise"] == pytest.approx(0.019) and s["noise_max"] == pytest.approx(0.020)
    assert s["bound"] == pytest.approx(0.019) and s["passed"] and s["overridden"] == 0
    quiet = [(10.0, 10.0, 10.001)] * 20
    assert ab.summarize(points, _records(points, quiet))["bound"] == ab.MIN_BOUND  # never below the 1%


def test_verdict_judges_only_rows_the_file_changes():
    points = [_p(1, "r1"), _p(2, "r1"), _p(4, "r1"), _p(8), _p(16, "r0"), _p(32, "r1", tuned_point=False)]
    times = [(10.0, 9.0, 10.0),     # a win
             (10.0, 10.05, 10.0),   # within the 1% bound: no measurable win, not slower
             (10.0, 10.3, 10.0),    # 3% slower: FAIL
             (10.0, 11.0, 10.0),    # no override: the planner's own row; a 10% excursion is noise, not judged
             (10.0, 12.0, 10.0),    # the override names the planner's row: the same kernel, not judged
             (10.0, 12.0, 10.0)]    # not a point of the file (a set's point the override's range covers)
    s = ab.summarize(points, _records(points, times))
    assert s["overridden"] == 3 and s["tuned_points"] == 5
    assert [r["m"] for r in s["wins"]] == [1] and [r["m"] for r in s["no_measurable_win"]] == [2]
    assert [r["m"] for r in s["slower"]] == [4] and not s["passed"]
    assert s["max_slowdown"] == pytest.approx(1.03) and s["target_met"] is False
    assert s["same_row_max_dev"] == pytest.approx(0.2)
    lines = ab.summary_lines(s)
    assert lines[-1].startswith("tune_ab: FAIL: 1 overridden point(s) slower than 1 + bound")
    assert any(x.startswith("tune_ab: SLOWER than 1 + bound (1): s M=4 gemm:r1 1.030") for x in lines)


def test_planner_is_the_geomean_of_both_planner_timings():
    points = [_p(1, "r1")]
    s = ab.summarize(points, _records(points, [(10.0, 10.0, 10.4)]))
    assert s["rows"][0]["ratio"] == pytest.approx(10.0 / (10.0 * 10.4) ** 0.5)
    assert s["rows"][0]["noise"] == pytest.approx(0.04) and s["bound"] == pytest.approx(0.04)


def test_unmeasured_or_wrong_overridden_points_fail():
    points = [_p(1, "r1"), _p(2, "r1"), _p(4)]
    recs = _records(points[:1] + points[2:], [(10.0, 9.0, 10.0), (10.0, 10.0, 10.0)])
    s = ab.summarize(points, recs)
    assert not s["passed"] and s["why"] == ["1 overridden tuned point(s) not measured"] and s["not_measured"] == 1
    recs = _records(points, [(10.0, 9.0, 10.0)] * 3)
    recs[1].note = "WRONG: relative error vs reference w8a8 0.5 > 0.03"
    s = ab.summarize(points, recs)
    assert not s["passed"] and s["why"] == ["1 point(s) with a wrong first output"]
    s = ab.summarize(points, [])
    assert not s["passed"] and "no point measured" in s["why"] and s["bound"] is None
    assert ab.summary_lines(s)[-1].startswith("tune_ab: FAIL")


# ------------------------------------------------------------------------------------------------
# The timing path, graphs faked on the CPU
# ------------------------------------------------------------------------------------------------


class FakeOps:
    """The ops the timing path calls, on CPU tensors: the tuned table in force is recorded at every call."""

    def __init__(self):
        self.table, self.calls = [], []

    def set_tuned_rows(self, entries):
        self.table = list(entries)

    def blockfp8_linear(self, x, b, b_scale):
        self.calls.append(len(self.table))
        return reference.linear_ref(x, b, b_scale, quantize_activations=False).to(x.dtype)


def test_each_variant_is_captured_with_its_own_table(tmp_path, monkeypatch):
    model = _dry_tuned(tmp_path, m="1,16")
    doc, entries = ab.load_tuned(model, dry_run=True)
    assert entries
    points = [p for p in ab.plan_points(doc, entries, "fp8-block", [], [1, 16], tune.DryRunTables())
              if p.n * p.k <= 512 * 256][:3]
    fake = FakeOps()
    captured = []  # per prepared graph: the tables in force at its calls (eager and "capture")

    def prepare_graph(factory, copies, *, check=None, on_wrong=None):
        start = len(fake.calls)
        fns = [factory(i) for i in range(copies)]
        first = fns[0]()
        assert check(first) is None
        for fn in fns:  # the capture
            fn()
        captured.append(set(fake.calls[start:]))
        return harness.PreparedGraph(lambda: None, copies, "fake", (len(fake.table),))

    def time_prepared(graphs, *, replays=harness.MIN_REPLAYS, warmup=harness.WARMUP_REPLAYS):
        return [harness.Timing(9.0 if g.keep[0] else 10.0, 0.0, g.copies, replays, "fake") for g in graphs]

    monkeypatch.setattr(harness, "prepare_graph", prepare_graph)
    monkeypatch.setattr(harness, "time_prepared", time_prepared)
    runner = harness.Runner(report=Report(script="t", ceilings=PUBLISHED_CEILINGS, replays=3), replays=3,
                            dry_run=False)
    torch.manual_seed(0)
    ab.run_points(runner, points, "fp8-block", entries, fake, device="cpu", max_copies=2)
    assert captured == [{0}, {len(entries)}, {0}] * len(points)
    assert fake.table == []  # cleared afterwards
    assert [(r.impl, r.us) for r in runner.report.records[:3]] == [(ab.PLANNER, 10.0), (ab.TUNED, 9.0),
                                                                     (ab.AGAIN, 10.0)]
    assert not any("WRONG" in r.note for r in runner.report.records)
