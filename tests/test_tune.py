"""Rows chosen from outside the tables: BLOCKFP8_FORCE (ops.py parses, ops.cpp pick_row applies) and
`blockfp8 tune`'s file (tuning.py, tools/tune.py). CPU tests for parsing, validation, the file and the tool's loop;
GPU tests (skip without one) that the op honours a forced and a tuned row, read from BLOCKFP8_LOG_ROWS's stderr."""

from __future__ import annotations

import json
import logging
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import save_file

from vllm_blockfp8 import cli, host_ops, ops, shapes, tuning
from vllm_blockfp8.tools import tune

from conftest import needs_kernels

KEY = {"gpu": "NVIDIA H200", "capability": "9.0", "driver": "580.1", "cuda": "13.0", "build_hash": "abc",
       "gemm_table": "auto"}


# ------------------------------------------------------------------------------------------------
# BLOCKFP8_FORCE
# ------------------------------------------------------------------------------------------------


def test_parse_force():
    assert ops.parse_force("") == {}
    assert ops.parse_force(" gemv:gemv_mma , gemm:sm90_x ") == {"gemv": "gemv_mma", "gemm": "sm90_x"}
    for bad, words in (("gemv", "not family:ROW"), ("gemv:", "not family:ROW"), ("bogus:r", "unknown family"),
                       ("gemv:a,gemv:b", "named twice")):
        with pytest.raises(ValueError, match=words):
            ops.parse_force(bad)


def test_bad_force_fails_at_import():
    env = dict(os.environ, BLOCKFP8_FORCE="lienar:gemv")
    res = subprocess.run([sys.executable, "-c", "import vllm_blockfp8.ops"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode != 0 and "unknown family 'lienar'" in res.stderr


def test_check_forced_rows_lists_valid_rows(monkeypatch):
    monkeypatch.setattr(host_ops, "kernels_unavailable_reason", lambda *a, **k: None)
    monkeypatch.setattr(host_ops, "tile_table", lambda family: [{"name": f"{family}_a"}, {"name": f"{family}_b"}])
    host_ops.check_forced_rows({"gemv": "gemv_b"})
    with pytest.raises(ValueError, match="no gemm row 'x'.*BLOCKFP8_GEMM_TABLE.*valid gemm rows: gemm_a, gemm_b"):
        host_ops.check_forced_rows({"gemv": "gemv_a", "gemm": "x"})


def test_check_forced_rows_without_kernels_checks_nothing(monkeypatch):
    monkeypatch.setattr(host_ops, "kernels_unavailable_reason", lambda *a, **k: "no CUDA GPU is visible")
    host_ops.check_forced_rows({"gemv": "no_such_row"})


# ------------------------------------------------------------------------------------------------
# The tuned file
# ------------------------------------------------------------------------------------------------


def _point(times, default="r0", family="gemv", n=4096, k=4096, m=8, lo=5):
    return {"family": family, "n": n, "k": k, "m": m, "m_min": lo, "m_max": m, "default_row": default,
            "times_us": times}


def test_select_overrides_needs_three_percent():
    points = [_point({"r0": 10.0, "r1": 10.0 / 1.029}),            # 2.9%: kept as the table chose
              _point({"r0": 10.0, "r1": 10.0 / 1.031}, m=16, lo=9),  # 3.1%: overridden
              _point({"r0": 9.0, "r1": 10.0}, m=4, lo=2)]             # the table's row wins
    out = tuning.select_overrides(points)
    assert [(o["m_min"], o["m_max"], o["row"]) for o in out] == [(9, 16, "r1")]
    assert out[0]["gain"] == pytest.approx(0.031, abs=1e-4)


def test_select_overrides_needs_the_gain_in_the_confirming_timing_too():
    kept = _point({"r0": 10.0, "r1": 9.0})
    kept["confirm_us"] = {"r0": 10.0, "r1": 9.5}                       # 5.3% again: kept, with the smaller gain
    noise = _point({"r0": 10.0, "r1": 9.0}, m=16, lo=9)
    noise["confirm_us"] = {"r0": 10.0, "r1": 10.2}                     # slower when timed again: dropped
    out = tuning.select_overrides([kept, noise])
    assert [(o["m_max"], o["row"]) for o in out] == [(8, "r1")]
    assert out[0]["gain"] == pytest.approx(10.0 / 9.5 - 1, abs=1e-4)


def test_tune_times_a_win_again_and_only_a_win():
    """The loop re-times the table's row against the winner (and nothing else) where the first timing found a win."""
    calls = []

    class Tables:
        def family_for(self, fmt, m, n, k):
            return "gemm"

        def rows(self, family, m, n, k):
            return ["a", "b", "c"]

        def default(self, family, m, n, k):
            return "a"

    def timer(family, rows, m, n, k):
        calls.append((m, list(rows)))
        win = m == 8
        return {"": 10.0, **{r: (8.0 if (r == "b" and win) else 11.0) for r in rows if r != "a"}}

    out = tune.tune("fp8-block", [(256, 512)], Tables(), timer, buckets=[4, 8])
    assert calls == [(4, ["a", "b", "c"]), (8, ["a", "b", "c"]), (8, ["a", "b"])]
    assert "confirm_us" not in out[0] and out[1]["confirm_us"] == {"a": 10.0, "b": 8.0}
    assert [o["row"] for o in tuning.select_overrides(out)] == ["b"]


def test_m_ranges_cover_up_to_the_last_bucket():
    assert tuning.m_ranges((1, 4, 8)) == [(1, 1), (2, 4), (5, 8)]
    assert tuning.m_ranges(shapes.TUNE_M)[-1] == (2049, 4096)


def test_write_read_round_trip(tmp_path):
    doc = tuning.document(KEY, [_point({"r0": 10.0, "r1": 9.0})], (4, 8), model="m")
    tuning.write(tmp_path / "t.json", doc)
    assert json.loads((tmp_path / "t.json").read_text()) == doc
    entries = tuning.parse((tmp_path / "t.json").read_text(), KEY)
    assert entries == [{"family": "gemv", "n": 4096, "k": 4096, "m_min": 5, "m_max": 8, "row": "r1"}]


@pytest.mark.parametrize("mutate, why", [
    (lambda d: "{not json", "not JSON"),
    (lambda d: "[1, 2]", "not a JSON object"),
    (lambda d: {**d, "version": 0}, "version 0; this package reads version 1"),
    (lambda d: {**d, "key": {**KEY, "gpu": "NVIDIA L4"}}, "stale: measured with gpu 'NVIDIA L4'"),
    (lambda d: {**d, "key": {**KEY, "build_hash": "old"}}, "stale: measured with build_hash 'old'"),
    (lambda d: {**d, "key": {**KEY, "gemm_table": "sm89"}}, "stale: measured with gemm_table 'sm89'"),
    (lambda d: {**d, "overrides": {}}, "'overrides' is not a list"),
    (lambda d: {**d, "overrides": [{**d["overrides"][0], "m_min": 9}]}, r"overrides\[0\] is malformed"),
    (lambda d: {**d, "overrides": [{**d["overrides"][0], "family": "x"}]}, r"overrides\[0\] is malformed"),
    (lambda d: {**d, "overrides": [{**d["overrides"][0], "row": "a b"}]}, r"overrides\[0\] is malformed"),
])
def test_bad_files_are_refused_with_the_reason(mutate, why):
    doc = tuning.document(KEY, [_point({"r0": 10.0, "r1": 9.0})], (4, 8))
    bad = mutate(doc)
    with pytest.raises(tuning.TunedFileError, match=why):
        tuning.parse(bad if isinstance(bad, str) else json.dumps(bad), KEY)


def test_load_applies_a_good_file_and_warns_once_on_a_stale_one(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv(tuning.ENV, raising=False)
    tuning.write(tmp_path / tuning.FILE_NAME, tuning.document(KEY, [_point({"r0": 10.0, "r1": 9.0})], (8,)))
    applied = []
    assert tuning.load(str(tmp_path), KEY, applied.append) == applied[0]
    assert applied[0][0]["row"] == "r1" and tuning.STATE["overrides"] == 1
    stale = {**KEY, "driver": "590.0"}
    with caplog.at_level(logging.WARNING, logger="vllm_blockfp8"):
        for _ in range(3):
            assert tuning.load(str(tmp_path), stale, applied.append) == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "stale: measured with driver '580.1'" in warnings[0]
    assert len(applied) == 1 and "driver" in tuning.STATE["ignored"]


def test_env_path_wins_and_none_disables(tmp_path, monkeypatch):
    (tmp_path / tuning.FILE_NAME).write_text("{}")
    monkeypatch.setenv(tuning.ENV, str(tmp_path / "other.json"))
    assert tuning.find(str(tmp_path)) == tmp_path / "other.json"
    monkeypatch.setenv(tuning.ENV, "none")
    assert tuning.find(str(tmp_path)) is None
    monkeypatch.delenv(tuning.ENV)
    assert tuning.find(str(tmp_path)) == tmp_path / tuning.FILE_NAME
    assert tuning.find(str(tmp_path / "missing")) is None


@pytest.mark.skipif(not ops.HAS_CUDA_KERNELS, reason="needs the compiled extension (the table lives in the op)")
def test_op_table_round_trip():
    entries = [{"family": "gemv", "n": 4096, "k": 4096, "m_min": 1, "m_max": 4, "row": "r1"},
               {"family": "nvfp4", "n": 8, "k": 64, "m_min": 5, "m_max": 5, "row": "r2"}]
    try:
        ops.set_tuned_rows(entries)
        assert ops.tuned_rows() == entries
        with pytest.raises(ValueError, match="1 <= m_min <= m_max"):
            ops.set_tuned_rows([{**entries[0], "m_min": 9}])
        assert ops.tuned_rows() == entries  # a refused table leaves the one in force
    finally:
        ops.set_tuned_rows([])
    assert ops.tuned_rows() == []


# ------------------------------------------------------------------------------------------------
# The tool
# ------------------------------------------------------------------------------------------------


def _fp8_checkpoint(path, hidden=256, inter=512):
    t = {}

    def linear(name, n, k):
        t[f"{name}.weight"] = torch.zeros(n, k, dtype=torch.float8_e4m3fn)
        t[f"{name}.weight_scale_inv"] = torch.ones(-(-n // 128), -(-k // 128))

    for layer in range(2):
        p = f"model.layers.{layer}"
        for proj, n in (("q_proj", hidden), ("k_proj", 128), ("v_proj", 128), ("o_proj", hidden)):
            linear(f"{p}.self_attn.{proj}", n, hidden)
        linear(f"{p}.mlp.gate_proj", inter, hidden)
        linear(f"{p}.mlp.up_proj", inter, hidden)
        linear(f"{p}.mlp.down_proj", hidden, inter)
        linear(f"{p}.mlp.experts.0.down_proj", hidden, 384)  # MoE: vLLM's kernels, not tuned
    t["model.embed_tokens.weight"] = torch.zeros(1000, hidden, dtype=torch.bfloat16)
    path.mkdir()
    save_file(t, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    return path


def test_model_shapes_fuse_as_vllm_serves(tmp_path):
    fmt, found = tune.model_shapes(_fp8_checkpoint(tmp_path / "m"))
    assert fmt == "fp8-block"
    assert found == [(256, 256), (256, 512), (512, 256), (1024, 256)]  # o, down, qkv, gate_up


def test_dry_run_walks_every_point(tmp_path, capsys):
    model = _fp8_checkpoint(tmp_path / "m")
    assert cli.main(["tune", str(model), "--dry-run", "--m", "1,16,64"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads((model / tuning.FILE_NAME).read_text())
    assert doc["key"] == tune.DRY_KEY and doc["buckets"] == [1, 16, 64]
    assert len(doc["measurements"]) == 4 * 3 and err.count("tune ") == 12 and "[12/12]" in err
    assert {p["family"] for p in doc["measurements"]} == {"gemv", "gemm"}
    assert doc["overrides"] == tuning.select_overrides(doc["measurements"])
    assert f"wrote {model / tuning.FILE_NAME}" in out
    # The dry run's file matches no machine: it is never applied.
    with pytest.raises(tuning.TunedFileError, match="stale"):
        tuning.parse((model / tuning.FILE_NAME).read_text(), KEY)


def test_tune_refusals(tmp_path, capsys):
    assert cli.main(["tune", str(tmp_path / "nope"), "--dry-run"]) == 2
    empty = tmp_path / "bf16"
    empty.mkdir()
    save_file({"model.layers.0.mlp.down_proj.weight": torch.zeros(8, 8, dtype=torch.bfloat16)},
              str(empty / "model.safetensors"))
    (empty / "config.json").write_text("{}")
    assert cli.main(["tune", str(empty), "--dry-run"]) == 2
    assert cli.main(["tune", str(empty), "--dry-run", "--m", "0,4"]) == 2
    err = capsys.readouterr().err
    assert "no block-FP8" in err and "--m takes comma-separated positive" in err


def test_tune_needs_no_benchmarks_directory(tmp_path, monkeypatch, capsys):
    """The timing harness ships in the package: without a GPU tune refuses for the kernels, never for a missing
    benchmarks/ (an installed wheel has none)."""
    model = _fp8_checkpoint(tmp_path / "m")
    monkeypatch.setattr(cli, "benchmarks_dir", lambda: tmp_path / "absent")
    monkeypatch.setattr(ops, "kernels_unavailable_reason", lambda: "test: no kernels")
    assert cli.main(["tune", str(model)]) == 2
    err = capsys.readouterr().err
    assert "cannot time kernels here: test: no kernels" in err and "source checkout" not in err


_IMPORT_CHECK = textwrap.dedent("""
    import sys
    sys.modules["benchmarks"] = None  # from here on any import of benchmarks raises ImportError
    from vllm_blockfp8.tools import harness, tune
    assert tune.harness is harness and callable(harness.prepare_graph) and callable(harness.time_prepared)
    print(sorted(m for m in sys.modules if m.startswith("benchmarks.")))
""")


def test_tune_imports_without_the_repository(tmp_path):
    """tune and its harness import from the package alone (a wheel ships no benchmarks/): in a process where
    `benchmarks` cannot be imported, run from a directory without one, they import and nothing of it is loaded;
    and no module of the package imports it, lazily either."""
    pkg_dir = pathlib.Path(tune.__file__).resolve().parents[1]  # .../vllm_blockfp8
    env = dict(os.environ, PYTHONPATH=str(pkg_dir.parent))
    res = subprocess.run([sys.executable, "-c", _IMPORT_CHECK], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"
    importers = [str(p) for p in pkg_dir.rglob("*.py")
                 if re.search(r"^\s*(from|import)\s+benchmarks\b", p.read_text(), re.M)]
    assert importers == []


# ------------------------------------------------------------------------------------------------
# On a GPU: the op honours the forced and the tuned row (BLOCKFP8_LOG_ROWS prints the row it ran)
# ------------------------------------------------------------------------------------------------

_GPU_SCRIPT = textwrap.dedent("""
    import sys, torch
    from vllm_blockfp8 import ops, reference
    m, n, k = 8, 4096, 4096
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b, s = reference.quantize_block_fp8(torch.randn(n, k, device="cuda"))
    if len(sys.argv) > 1:
        ops.set_tuned_rows([dict(family="gemv", n=n, k=k, m_min=1, m_max=16, row=sys.argv[1])])
    ops.blockfp8_gemv(x, b, s)
    torch.cuda.synchronize()
""")


def _run_logged(env_extra, *argv):
    env = dict(os.environ, BLOCKFP8_LOG_ROWS="1", **env_extra)
    res = subprocess.run([sys.executable, "-c", _GPU_SCRIPT, *argv], env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    return [line for line in res.stderr.splitlines() if line.startswith("[blockfp8] gemv N=4096")]


def _other_gemv_row():
    rows = [r["name"] for r in ops.tile_table("gemv")]
    chosen = ops.selected_row("gemv", 8, 4096, 4096)
    others = [r for r in rows if r != chosen and not torch.ops.blockfp8.row_rejects(
        "gemv", rows.index(r), 8, 4096, 4096, 0, 4096)]
    if not others:
        pytest.skip("no second gemv row takes M=8 N=4096 K=4096 on this GPU")
    return chosen, others[0]


@needs_kernels()
def test_forced_row_is_honoured():
    chosen, other = _other_gemv_row()
    assert _run_logged({})[-1].endswith(f"-> {chosen}")
    assert _run_logged({"BLOCKFP8_FORCE": f"gemv:{other}"})[-1].endswith(f"-> {other}")


@needs_kernels()
def test_tuned_row_is_honoured():
    chosen, other = _other_gemv_row()
    assert _run_logged({}, other)[-1].endswith(f"-> {other}")


_TIMER_SCRIPT = textwrap.dedent("""
    from vllm_blockfp8 import ops
    from vllm_blockfp8.tools import tune
    m, n, k = 64, 4096, 4096
    tables = tune.GpuTables()
    family = tables.family_for("fp8", m, n, k)
    rows = [r for r in tables.rows(family, m, n, k) if r != tables.default(family, m, n, k)][:2]
    times = tune.gpu_timer(family, rows, m, n, k)
    assert set(times) == {"", *rows} and all(t > 0 for t in times.values()), times
    assert ops.tuned_rows() == [], ops.tuned_rows()  # the one-entry tables are gone
    print(family, *rows)
""")


@needs_kernels()
def test_gpu_timer_times_each_row_inside_the_full_linear():
    """tune times a GEMM row as the layer serves it: blockfp8_linear (the quantizer, then that row, put in force as a
    one-entry tuned table), not the GEMM op alone (where rows won that then lost in the full linear)."""
    env = dict(os.environ, BLOCKFP8_LOG_ROWS="1")
    res = subprocess.run([sys.executable, "-c", _TIMER_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    family, *rows = res.stdout.split()
    if family != "gemm" or not rows:
        pytest.skip(f"M = 64 runs {family} with {len(rows)} other row(s) on this GPU")
    logged = res.stderr.splitlines()
    assert any(line.startswith("[blockfp8] linear N=4096 K=4096 M=64 -> ") for line in logged), res.stderr
    for row in rows:
        assert f"[blockfp8] gemm N=4096 K=4096 M=64 -> {row}" in logged, (row, res.stderr)
