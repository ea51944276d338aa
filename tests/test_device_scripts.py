"""CPU tests of tools/h200_e2e.sh's plumbing (no GPU, no vLLM): a fake interpreter stands in for
every Python step, and the script runs from a copy of tools/ in a temporary tree."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="needs bash and coreutils timeout (the script's steps use it)")


def _start(tmp_path: Path, fake_body: str, stages: list[str]) -> tuple[subprocess.Popen, Path]:
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
    # A TERM the test process ignores would be ignored by bash too (and then cannot be trapped).
    proc = subprocess.Popen(["bash", str(tree / "tools" / "h200_e2e.sh"), *stages], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
    return proc, out


def _archive(out: Path, log: str) -> tuple[str, list[str]]:
    archive = out / "e2e-t.tgz"
    assert archive.exists(), log
    with tarfile.open(archive) as t:
        return t.extractfile("e2e-t/summary.tsv").read().decode(), t.getnames()


def test_a_finished_call_packs_its_own_archive_with_a_summary_row_per_stage(tmp_path):
    proc, out = _start(tmp_path, "exit 0", ["demo", "no_such_stage"])
    log, _ = proc.communicate(timeout=60)
    summary, names = _archive(out, log)
    rows = [line.split("\t") for line in summary.splitlines()]
    assert [(r[0], r[1]) for r in rows] == [("demo", "0"), ("no_such_stage", "3")]
    assert proc.returncode == 1  # a stage that did not run fails the call
    assert "e2e-t/demo.log" in names and not (out / "e2e-t").exists()


def test_a_term_during_a_step_still_packs_what_finished_and_marks_the_running_step(tmp_path):
    # The demo step sleeps far past the test: TERM (what an outer `timeout` sends) must stop it,
    # record it and pack, promptly.
    body = 'case "$*" in *demo*) echo started; sleep 60 ;; *) exit 0 ;; esac'
    proc, out = _start(tmp_path, body, ["demo"])
    step_log = out / "e2e-t" / "demo.log"
    deadline = time.time() + 30
    while not (step_log.exists() and "started" in step_log.read_text()):
        assert proc.poll() is None and time.time() < deadline, "the demo step never started"
        time.sleep(0.05)
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    log, _ = proc.communicate(timeout=30)
    assert time.time() - t0 < 20, "the script waited for the step instead of stopping it"
    assert proc.returncode == 143, log
    summary, names = _archive(out, log)
    [row] = [line.split("\t") for line in summary.splitlines()]
    assert row[0] == "demo" and row[1] == "143" and row[3].startswith("INTERRUPTED"), row
    assert "e2e-t/demo.log" in names
