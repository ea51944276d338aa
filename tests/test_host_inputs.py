"""Every host op that takes text or names refuses bad input with an error, never a crash, on every device type.

A tuned file is read at vLLM startup and BLOCKFP8_FORCE / BLOCKFP8_GEMM_TABLE come from the environment, so a path
from a file or a variable to a host op must end in a ValueError (the package's wrappers) or a RuntimeError (the raw
op), not in a dead process. Each probe runs in a child process, so a crash is reported as that probe's crash instead
of taking pytest down. Runs wherever the extension is built: CPU CI and, with a GPU present, the GPU machine (where
the tuned-table op once segfaulted while CPU runs passed).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from vllm_blockfp8 import ops

pytestmark = pytest.mark.skipif(not ops.HAS_CUDA_KERNELS, reason="needs the compiled extension (the ops live in it)")

GARBAGE = ["", " ", "\x00", "\xff\xfe", "sm 90", "a" * 5000, "gemv\n", "none;", "../../etc", "é"]

# (what, python statement): the package's wrapper must raise ValueError; the raw op (no exception may leave it, see
# csrc/host_queries.cpp) must answer with its error value, which the statement turns into a ValueError; anything else
# (no error, another exception, a dead process) fails.
PROBES = [
    ("set_tuned_rows bad line", "ops.set_tuned_rows([{'family': 'gemv', 'n': 1, 'k': 1, 'm_min': 5, 'm_max': 1, "
                                "'row': 'r'}])"),
    ("set_tuned_rows bad family", "ops.set_tuned_rows([{'family': B, 'n': 1, 'k': 1, 'm_min': 1, 'm_max': 1, "
                                  "'row': 'r'}])"),
    ("set_tuned_rows bad row", "ops.set_tuned_rows([{'family': 'gemv', 'n': 1, 'k': 1, 'm_min': 1, 'm_max': 1, "
                               "'row': B}])"),
    ("set_tuned_rows missing field", "ops.set_tuned_rows([{'family': 'gemv'}])"),
    # Blank text clears the table (""), any other garbage is answered with a reason.
    ("raw set_tuned_rows", "r = torch.ops.blockfp8.set_tuned_rows(torch.tensor(list(B.encode()), dtype=torch.uint8)); "
                           "assert (r == '') == (B.strip() == ''), r; raise ValueError(r)"),
    ("raw set_tuned_rows not bytes", "r = torch.ops.blockfp8.set_tuned_rows(torch.zeros(len(B) + 1)); "
                                     "assert 'uint8' in r, r; raise ValueError(r)"),
    ("set_gemm_table", "ops.set_gemm_table(B)"),
    ("raw set_gemm_table", "r = torch.ops.blockfp8.set_gemm_table(B); assert r == '', r; raise ValueError"),
    ("set_sm90_pdl", "ops.set_sm90_pdl(B)"),
    ("raw set_sm90_pdl", "r = torch.ops.blockfp8.set_sm90_pdl(B); assert r == '', r; raise ValueError"),
    ("tile_table", "ops.tile_table(B)"),
    ("selected_row", "ops.selected_row(B, 8, 4096, 4096)"),
    ("gemm_table_rows", "ops.gemm_table_rows(B)"),
    ("raw gemm_table_rows", "r = torch.ops.blockfp8.gemm_table_rows(B); assert 'error' in json.loads(r), r; "
                            "raise ValueError"),
    ("gemm_table_plan", "ops.gemm_table_plan(B, 64, 4096, 4096, 132)"),
    ("raw gemm_table_plan", "r = torch.ops.blockfp8.gemm_table_plan(B, -1, 64, 4096, 4096, 132); "
                            "assert 'error' in json.loads(r), r; raise ValueError"),
    ("gemm_self_check", "ops.gemm_self_check(B)"),
    ("raw gemm_self_check", "r = torch.ops.blockfp8.gemm_self_check(B); assert 'error' in json.loads(r), r; "
                            "raise ValueError"),
    ("raw first_use_run", "r = torch.ops.blockfp8.first_use_run(B, 120, 0); assert r.startswith('no row'), r; "
                          "raise ValueError"),
    ("raw nvfp4_self_check_run", "r = torch.ops.blockfp8.nvfp4_self_check_run(-2 - len(B), False); "
                                 "assert 'out of range' in r, r; raise ValueError"),
    ("nvfp4_self_check_run", "ops.nvfp4_self_check_run(-2 - len(B))"),
    ("parse_force family", "ops.parse_force(B + '?:x')"),
    ("parse_force row", "ops.parse_force('gemv:' + B + '?')"),
]

SCRIPT = textwrap.dedent("""
    import json, sys, torch
    from vllm_blockfp8 import ops
    probes, garbage = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    start_table = ops.set_gemm_table("auto")
    for what, stmt in probes:
        for B in garbage:
            print(json.dumps({"probe": what, "input": B}), flush=True)  # the last line names a crash
            try:
                exec(stmt, {"ops": ops, "torch": torch, "json": json, "B": B})
                outcome = "no error"
            except ValueError:
                outcome = "refused"
            except Exception as exc:
                outcome = f"{type(exc).__name__}: {exc}"
            print(json.dumps({"probe": what, "input": B, "outcome": outcome}), flush=True)
    # The tables in force are what they were: a refused input changed nothing.
    assert ops.tuned_rows() == [], ops.tuned_rows()
    assert ops.set_gemm_table(start_table) == "auto"
    print("done", flush=True)
""")


def test_bad_names_and_text_are_refused_never_crash():
    res = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(PROBES), json.dumps(GARBAGE)],
                         capture_output=True, text=True, timeout=300)
    lines = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
    if res.returncode != 0:
        last = lines[-1] if lines else None
        pytest.fail(f"the probe process died (rc {res.returncode}) at {last}: {res.stderr[-3000:]}")
    assert res.stdout.rstrip().endswith("done"), res.stdout[-2000:]
    done = [x for x in lines if "outcome" in x]
    assert len(done) == len(PROBES) * len(GARBAGE)
    wrong = [x for x in done if x["outcome"] != "refused"]
    assert not wrong, wrong[:10]


def test_a_refused_tuned_table_keeps_the_one_in_force():
    entries = [{"family": "gemv", "n": 4096, "k": 4096, "m_min": 1, "m_max": 4, "row": "r1"}]
    try:
        ops.set_tuned_rows(entries)
        for bad in ("gemv 1 1 1 1 r\x00w", "linearx 1 1 1 1 r", "gemv 1 1 1 1 " + "r" * 65, "gemv 1 1 2 1 r"):
            assert torch.ops.blockfp8.set_tuned_rows(torch.tensor(list(bad.encode()), dtype=torch.uint8)) != ""
            assert ops.tuned_rows() == entries
    finally:
        ops.set_tuned_rows([])
    assert ops.tuned_rows() == []
