"""CPU tests of tools/h200_e2e.sh's plumbing (no GPU, no vLLM): a fake interpreter stands in for
every Python step, and the script runs from a copy of tools/ in a temporary tree."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="needs bash and coreutils timeout")


def _run(tmp_path: Path, fake_body: str, stages: list[str], outer_timeout_s: int | None = None):
    tree = tmp_path / "tree"
    (tree / "tools").mkdir(parents=True)
    shutil.copy(ROOT / "tools" / "h200_e2e.sh", tree / "tools" / "h200_e2e.sh")
    fake = tmp_path / "fakepy.sh"
    fake.write_text("#!/bin/bash\n" + fake_body + "\n")
    fake.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, OUT=str(out), PYTHON=str(fake), VLLM_USE_FLASHINFER_SAMPLER="0",
               PACK_CACHE="0", E2E_TAG="t")
    cmd = ["bash", str(tree / "tools" / "h200_e2e.sh"), *stages]
    if outer_timeout_s:
        cmd = ["timeout", str(outer_timeout_s), *cmd]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    archive = out / "e2e-t.tgz"
    assert archive.exists(), proc.stdout + proc.stderr
    with tarfile.open(archive) as t:
        summary = t.extractfile("e2e-t/summary.tsv").read().decode()
        names = t.getnames()
    return proc, summary, names


def test_a_finished_call_packs_its_own_archive_with_a_summary_row_per_stage(tmp_path):
    proc, summary, names = _run(tmp_path, "exit 0", ["demo", "no_such_stage"])
    rows = [line.split("\t") for line in summary.splitlines()]
    assert [(r[0], r[1]) for r in rows] == [("demo", "0"), ("no_such_stage", "3")]
    assert proc.returncode == 1  # a stage that did not run fails the call
    assert "e2e-t/demo.log" in names and not (tmp_path / "out" / "e2e-t").exists()


def test_an_outer_timeout_still_packs_what_finished_and_marks_the_running_step(tmp_path):
    # The demo step sleeps past the outer cap: the script must stop it, record it and pack.
    body = 'case "$*" in *demo*) echo started; sleep 60 ;; *) exit 0 ;; esac'
    proc, summary, names = _run(tmp_path, body, ["demo"], outer_timeout_s=3)
    assert proc.returncode == 124  # timeout's own code: the call was cut short
    [row] = [line.split("\t") for line in summary.splitlines()]
    assert row[0] == "demo" and row[1] == "143" and row[3].startswith("INTERRUPTED"), row
    assert "e2e-t/demo.log" in names
