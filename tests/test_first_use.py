"""The isolated first-use check (vllm_blockfp8/first_use.py): which rows a GPU checks before their first run, the
child-process protocol (a crash or hang names its row and the rest still get checked), and the outcome recorded in
this process. The orchestration runs on CPU with a scripted child; the real child needs a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from vllm_blockfp8 import first_use, ops

from conftest import needs_kernels

ROWS = [{"family": "gemm", "table": 120, "row": i, "name": f"r{i}"} for i in range(4)]


def scripted(children):
    """A runner that plays `children` in turn: each a (rc, {row index: why}) pair; rows not in the dict are the ones
    the child never reported (it died on the first of them)."""
    calls = []

    def runner(device, rows, timeout_s):
        rc, results = children[len(calls)]
        calls.append([r["row"] for r in rows])
        out = "\n".join(json.dumps({**{k: r[k] for k in ("family", "table", "row")}, "why": results[r["row"]]})
                        for r in rows if r["row"] in results)
        return rc, "some import chatter\n" + out, "Traceback ...\nRuntimeError: CUDA error: an illegal memory access"
    return runner, calls


def recorder():
    got = []
    return got, lambda family, table, row, why: got.append((family, table, row, why))


def test_every_row_passes_in_one_child():
    runner, calls = scripted([(0, {0: "", 1: "", 2: "", 3: ""})])
    got, record = recorder()
    out = first_use.check_isolated(ROWS, 0, record, runner=runner)
    assert calls == [[0, 1, 2, 3]] and out == {"r0": "", "r1": "", "r2": "", "r3": ""}
    assert got == [("gemm", 120, i, "") for i in range(4)]


def test_a_mismatch_is_recorded_as_the_child_reports_it():
    runner, calls = scripted([(0, {0: "", 1: "3 of 52272 outputs outside tolerance", 2: "", 3: ""})])
    got, record = recorder()
    out = first_use.check_isolated(ROWS, 0, record, runner=runner)
    assert calls == [[0, 1, 2, 3]] and out["r1"].startswith("3 of 52272") and out["r0"] == out["r2"] == ""


def test_a_crash_names_its_row_and_a_new_child_checks_the_rest():
    # The first child reports row 0 and dies on row 1; the second checks 2 and 3.
    runner, calls = scripted([(-11, {0: ""}), (0, {2: "", 3: ""})])
    got, record = recorder()
    out = first_use.check_isolated(ROWS, 0, record, runner=runner)
    assert calls == [[0, 1, 2, 3], [2, 3]]
    assert out["r0"] == "" and out["r2"] == "" and out["r3"] == ""
    assert "exited with -11 while checking this row" in out["r1"] and "illegal memory access" in out["r1"]
    assert sorted(r[2] for r in got) == [0, 1, 2, 3], "every row ends recorded, once"


def test_a_hang_fails_its_row_and_every_row_still_ends_recorded():
    runner, calls = scripted([(-9, {}), (-9, {}), (0, {2: "", 3: ""})])
    got, record = recorder()
    out = first_use.check_isolated(ROWS, 0, record, runner=runner)
    assert calls == [[0, 1, 2, 3], [1, 2, 3], [2, 3]]
    assert "timed out" in out["r0"] and "timed out" in out["r1"] and out["r2"] == out["r3"] == ""
    assert len(got) == 4


def test_child_timeout_is_reported_as_a_hang():
    """run_child itself: a child that sleeps past the timeout comes back as rc -9 with the reason."""
    orig = first_use._child_command
    try:
        first_use._child_command = lambda device, rows: [sys.executable, "-c", "import time; time.sleep(30)"]
        rc, out, err = first_use.run_child(0, ROWS, 1)
    finally:
        first_use._child_command = orig
    assert rc == -9 and "timed out after 1 s" in err


def test_summary_line_counts_and_names_failures():
    assert first_use.summary_line({"a": "", "b": ""}, 1.25) == (
        "[blockfp8] first-use check: 2 rows in a child process, 2 passed in 1.2 s")
    line = first_use.summary_line({"a": "", "z": "mismatch", "b": "exited"}, 3.0)
    assert "3 rows" in line and "1 passed" in line and "failed: b, z (they yield to the safe path)" in line


def test_inprocess_mode_skips_the_child(monkeypatch):
    monkeypatch.setenv("BLOCKFP8_SELF_CHECK", "inprocess")
    monkeypatch.setattr(first_use, "_done", False)
    assert first_use.ensure_checked() is None


@pytest.mark.skipif(not ops.HAS_CUDA_KERNELS, reason="needs the compiled extension vllm_blockfp8._C")
def test_pending_rows_follow_the_gpu_and_the_recorded_outcome():
    """Host logic: an SM120 GPU checks its GEMM rows and its native NVFP4 rows; an SM90 GPU nothing (hardware-tested);
    a recorded outcome takes a row off the list and shows in the states. Runs in a child so the states start fresh."""
    code = """
import json
from vllm_blockfp8 import ops
info = ops.build_info()
out = {"sm90": ops.first_use_pending((9, 0)), "sm120": ops.first_use_pending((12, 0)), "sm89": ops.first_use_pending((8, 9))}
if out["sm120"]:
    r = out["sm120"][0]
    out["recorded"] = ops.first_use_record(r["family"], r["table"], r["row"], "scripted mismatch")
    out["after"] = ops.first_use_pending((12, 0))
    out["states"] = ops.gemm_self_check("sm120") if r["family"] == "gemm" else ops.nvfp4_self_check()
out["info"] = info
print(json.dumps(out))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["sm90"] == [], "SM90 is hardware-tested: nothing to check"
    families = out["info"]["families"]
    want120 = [("gemm", 120, r["name"]) for r in ops.gemm_table_rows("sm120")]
    want120 += [("nvfp4", 120, r["name"]) for r in ops.nvfp4_native_rows()]
    assert [(r["family"], r["table"], r["name"]) for r in out["sm120"]] == want120
    assert [(r["family"], r["table"]) for r in out["sm89"]] == [("gemm", 89)] * len(ops.gemm_table_rows("sm89"))
    if want120:
        assert out["recorded"] is True and len(out["after"]) == len(want120) - 1
        first = out["states"][0]
        assert first["state"] == "failed" and first["detail"] == "scripted mismatch", out["states"]
        assert "scripted mismatch" in proc.stderr, "a recorded failure prints its one warning"
    assert "sm120" in families["gemm"] or not want120


@needs_kernels()
def test_isolated_check_passes_every_row_on_this_gpu():
    """The real child on the GPU at hand, with every row of its tables checked (BLOCKFP8_SELF_CHECK=always)."""
    code = "import json; from vllm_blockfp8 import first_use; print(json.dumps(first_use.ensure_checked()))"
    env = {**os.environ, "BLOCKFP8_SELF_CHECK": "always"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out and all(why == "" for why in out.values()), out
    assert f"first-use check: {len(out)} rows in a child process, {len(out)} passed" in proc.stderr
