"""CPU tests of the plumbing of dev/device/h200_e2e.sh, h200_pending.sh and h200_tune.sh (no GPU, no vLLM): a fake
interpreter stands in for every Python step, and the script runs from a copy of dev/device/ in a temporary tree; and
of benchmarks/analysis/ab_compare.py's ratios."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FI_SH = ROOT / "dev" / "device" / "flashinfer_site.sh"
VK_SH = ROOT / "dev" / "device" / "vllm_bundle.sh"
pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="needs bash and coreutils timeout (the script's steps use it)")


def _start(tmp_path: Path, fake_body: str, stages: list[str], **env_extra) -> tuple[subprocess.Popen, Path]:
    tree = tmp_path / "tree"
    (tree / "dev" / "device").mkdir(parents=True)
    shutil.copy(ROOT / "dev" / "device" / "h200_e2e.sh", tree / "dev" / "device" / "h200_e2e.sh")
    shutil.copy(FI_SH, tree / "dev" / "device" / "flashinfer_site.sh")
    fake = tmp_path / "fakepy.sh"
    fake.write_text("#!/bin/bash\n" + fake_body + "\n")
    fake.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, OUT=str(out), PYTHON=str(fake), VLLM_USE_FLASHINFER_SAMPLER="0",
               PACK_CACHE="0", E2E_TAG="t", **env_extra)
    # A TERM the test process ignores would be ignored by bash too (and then cannot be trapped).
    proc = subprocess.Popen(["bash", str(tree / "dev" / "device" / "h200_e2e.sh"), *stages], env=env,
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


def test_take_appends_the_smollm2_chunk_each_call_carries_in_order(tmp_path):
    """One chunk per call, each taken by the call that carries it (`take` runs nothing else); a chunk that arrives
    before its predecessor is refused; the GGUF gets its name only when whole."""
    gguf = tmp_path / "model" / "smol.gguf"
    env = dict(SMOL_GGUF=str(gguf), SMOL_BYTES="5")
    vs = tmp_path / "tree" / ".vs"

    def call(part: str, data: bytes) -> str:
        shutil.rmtree(tmp_path / "tree", ignore_errors=True)
        shutil.rmtree(tmp_path / "out", ignore_errors=True)
        vs.mkdir(parents=True)
        (vs / part).write_bytes(data)
        proc, _ = _start(tmp_path, "exit 0", ["take"], **env)
        log, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, log
        return log

    assert "arrived before part 0" in call("smol.part-01", b"de") and not gguf.exists()
    assert "took smol.part-00 (3 of 5 bytes)" in call("smol.part-00", b"abc") and not gguf.exists()
    assert "took smol.part-01 (5 of 5 bytes)" in call("smol.part-01", b"de")
    assert gguf.read_bytes() == b"abcde"
    assert "took" not in call("smol.part-01", b"de")  # a whole GGUF takes nothing more


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


# The fake interpreter for the model makers: make_qwen3_8b.py DIR ... writes DIR/manifest.json, and DIR/nvfp4/config.json
# with --nvfp4 (removing a stale one without, as the maker does); every call is logged.
_FAKE_MAKERS = """echo "$*" >> "$(dirname "$0")/calls.log"
case "$*" in
  *make_qwen3_8b.py*) rm -rf "$2/nvfp4"; mkdir -p "$2" && echo {} > "$2/manifest.json"
    case "$*" in *--nvfp4*) mkdir -p "$2/nvfp4" && echo {} > "$2/nvfp4/config.json" ;; esac ;;
esac
exit 0"""


def _calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def test_nvfp4_variants_make_the_nvfp4_checkpoint_in_the_model_pass_and_pass_it_to_the_benchmarks(tmp_path):
    """With an NVFP4 variant in VARIANTS, prep makes the 36-layer model with --nvfp4 (nvfp4/ written in the same pass
    on the GPU: one step, no bf16 weights, no quantization step of its own) under CAP_prep; the 4-layer model stays
    without it; the serving stage gets --nvfp4; a second call finds everything made. A model made earlier without
    nvfp4/ is remade whole with --nvfp4."""
    models = tmp_path / "models"
    env = dict(MODELS=str(models), VARIANTS="blockfp8,nvfp4,marlin-fp4", CAP_prep="77")
    proc, out = _start(tmp_path, _FAKE_MAKERS, ["prep", "latency"], **env)
    log, _ = proc.communicate(timeout=60)
    makers = [c for c in _calls(tmp_path) if "make_qwen3_8b.py" in c]
    q3, q3s = models / "q3-36L", models / "q3-4L"
    assert makers == [f"benchmarks/serving/make_qwen3_8b.py {q3} --layers 36 --nvfp4",
                      f"benchmarks/serving/make_qwen3_8b.py {q3s} --layers 4 --bf16-weights"], log
    assert "=== prep_q3-36L (cap 77s)" in log and "nvfp4-only" not in log
    [serving] = [c for c in _calls(tmp_path) if "run_serving.py" in c]
    assert f"--nvfp4 {q3}/nvfp4 " in serving and "--variants blockfp8,nvfp4,marlin-fp4" in serving
    summary, _ = _archive(out, log)
    rows = {r.split("\t")[0]: r.split("\t")[1] for r in summary.splitlines()}
    assert rows["prep_q3-36L"] == rows["latency"] == "0" and "prep_q3-36L_nvfp4" not in rows, summary

    (tmp_path / "calls.log").unlink()
    proc, out = _start(tmp_path / "again", _FAKE_MAKERS.replace('"$(dirname "$0")/calls.log"',
                                                                f'"{tmp_path}/calls.log"'), ["latency"], **env)
    log, _ = proc.communicate(timeout=60)
    assert not [c for c in _calls(tmp_path) if "make_qwen3_8b.py" in c], log

    # Made earlier without nvfp4/ (an FP8-only call, or a step killed before nvfp4/config.json): remade with --nvfp4.
    (tmp_path / "calls.log").unlink()
    shutil.rmtree(q3 / "nvfp4")
    proc, out = _start(tmp_path / "third", _FAKE_MAKERS.replace('"$(dirname "$0")/calls.log"',
                                                                f'"{tmp_path}/calls.log"'), ["latency"], **env)
    log, _ = proc.communicate(timeout=60)
    assert [c for c in _calls(tmp_path) if "make_qwen3_8b.py" in c] == [
        f"benchmarks/serving/make_qwen3_8b.py {q3} --layers 36 --nvfp4"], log


def _maker_calls(tmp_path, stage: str, variants: str):
    """The make_qwen3_8b.py calls h200_e2e.sh makes for STAGE with VARIANTS (fake makers), and its log."""
    proc, _ = _start(tmp_path, _FAKE_MAKERS, [stage], MODELS=str(tmp_path / "models"), VARIANTS=variants)
    log, _ = proc.communicate(timeout=60)
    return [c for c in _calls(tmp_path) if "make_qwen3_8b.py" in c], log


def test_quick_nvfp4_makes_the_4_layer_model_with_bf16_weights_and_nvfp4(tmp_path):
    calls, log = _maker_calls(tmp_path, "serving_quick", "nvfp4,marlin-fp4")
    assert calls == [f"benchmarks/serving/make_qwen3_8b.py {tmp_path / 'models' / 'q3-4L'} --layers 4 "
                     "--bf16-weights --nvfp4"], log


def test_fp8_variants_make_no_nvfp4_checkpoint(tmp_path):
    calls, log = _maker_calls(tmp_path, "latency", "blockfp8,vllm-fp8-block")
    assert calls == [f"benchmarks/serving/make_qwen3_8b.py {tmp_path / 'models' / 'q3-36L'} --layers 36"], log


def test_ab_compare_cancels_run_order_and_reports_each_m(tmp_path, capsys):
    """benchmarks/analysis/ab_compare.py: per point the geomean over the two run orders of
    candidate / base, then per M and overall; points missing from a run are left out, not compared
    against nothing."""
    import json

    from benchmarks.analysis import ab_compare as ab

    def run(path, times):
        recs = [{"impl": "ours", "shape": "s1", "m": 64, "us": 1.0}]  # the selected row: ignored
        recs += [{"impl": f"ours@{row}", "shape": s, "m": m, "us": us} for (s, m, row), us in times.items()]
        path.write_text(json.dumps({"header": {"git": "x"}, "records": recs}))
        return path

    # Run a favours whichever row goes first by 10%, run b the other: the order effect cancels.
    a = run(tmp_path / "a.json", {("s1", 64, "base"): 10.0, ("s1", 64, "cand"): 8.0 * 1.1,
                                  ("s2", 64, "base"): 10.0, ("s2", 64, "cand"): 12.0 * 1.1,
                                  ("s1", 128, "base"): 10.0, ("s1", 128, "cand"): 5.0})
    b = run(tmp_path / "b.json", {("s1", 64, "base"): 10.0 * 1.1, ("s1", 64, "cand"): 8.0,
                                  ("s2", 64, "base"): 10.0 * 1.1, ("s2", 64, "cand"): 12.0})
    out = tmp_path / "merged.json"
    assert ab.main(["base", str(a), str(b), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "cand / base: 0.980 over 2 points, faster at 1" in text  # sqrt(0.8 * 1.2); M = 128 only in a
    assert "M=64     0.980  range 0.80-1.20  worst s2" in text
    merged = json.loads(out.read_text())
    assert merged["base"] == "base" and [r["file"] for r in merged["runs"]] == ["a.json", "b.json"]
    assert ["s1", 64, "cand", 8.8] in merged["runs"][0]["us"]
    with pytest.raises(SystemExit):  # an odd file count: the runs are not in (a, b) pairs
        ab.main(["base", str(a)])


def test_ab_compare_against_the_selected_row(tmp_path, capsys):
    """Base `selected`: per point the row the table picked in that run (its forced time, else the
    un-forced time); --only-selected keeps the points where the table picked one of the rows named."""
    import json

    from benchmarks.analysis import ab_compare as ab

    def run(path, selected, times):
        recs = [{"impl": "ours", "shape": s, "m": m, "us": us, "row": row} for (s, m), (row, us) in selected.items()]
        recs += [{"impl": f"ours@{row}", "shape": s, "m": m, "us": us} for (s, m, row), us in times.items()]
        path.write_text(json.dumps({"header": {"git": "x"}, "records": recs}))
        return path

    # s1: the table picks "old" (forced, 10 us; its un-forced time 99 must not be used); s2 picks
    # "other" (not forced: its un-forced 20 us is the base).
    sel = {("s1", 64): ("old", 99.0), ("s2", 64): ("other", 20.0)}
    times = {("s1", 64, "old"): 10.0, ("s1", 64, "cand"): 8.0, ("s2", 64, "cand"): 10.0}
    a = run(tmp_path / "a.json", sel, times)
    b = run(tmp_path / "b.json", sel, times)
    assert ab.main(["selected", str(a), str(b)]) == 0
    text = capsys.readouterr().out
    assert "cand / selected: 0.632 over 2 points" in text  # sqrt(0.8 * 0.5)
    assert ab.main(["selected", str(a), str(b), "--only-selected", "old"]) == 0
    text = capsys.readouterr().out
    assert "cand / selected: 0.800 over 1 points" in text and "old / selected: 1.000 over 1 points" in text


def test_ab_compare_settings_pairs_the_same_row_across_runs(tmp_path, capsys):
    """--settings: (candidate setting, base setting) runs of the same row; per point the geomean
    over the pairs of the row's time ratio, gzip-compressed runs read as well; a point missing
    from one pair is left out."""
    import gzip
    import json

    from benchmarks.analysis import ab_compare as ab

    def run(path, times):
        recs = [{"impl": f"ours@{row}", "shape": s, "m": m, "us": us} for (s, m, row), us in times.items()]
        text = json.dumps({"header": {"git": "x"}, "records": recs})
        if path.name.endswith(".gz"):
            path.write_bytes(gzip.compress(text.encode()))
        else:
            path.write_text(text)
        return path

    cand1 = run(tmp_path / "c1.json.gz", {("s1", 32, "row"): 8.0, ("s2", 32, "row"): 10.0, ("s3", 32, "row"): 1.0})
    base1 = run(tmp_path / "b1.json", {("s1", 32, "row"): 10.0, ("s2", 32, "row"): 10.0, ("s3", 32, "row"): 1.0})
    cand2 = run(tmp_path / "c2.json", {("s1", 32, "row"): 9.0, ("s2", 32, "row"): 11.0})
    base2 = run(tmp_path / "b2.json", {("s1", 32, "row"): 10.0, ("s2", 32, "row"): 10.0})
    assert ab.main(["--settings", "nosplit", str(cand1), str(base1), str(cand2), str(base2)]) == 0
    text = capsys.readouterr().out
    # s1: sqrt(0.8 * 0.9); s2: sqrt(1.0 * 1.1); s3 only in the first pair: left out
    assert f"row / nosplit: {ab.geomean([math.sqrt(0.72), math.sqrt(1.1)]):.3f} over 2 points, faster at 1" in text


# ---- dev/device/h200_pending.sh ----------------------------------------------------------------------------------


PENDING = ROOT / "dev" / "device" / "h200_pending.sh"
LIB = ROOT / "dev" / "device" / "lib.sh"
PREBUILT = ROOT / "dev" / "device" / "prebuilt.sh"


def test_pending_script_parses_and_its_paths_exist():
    subprocess.run(["bash", "-n", str(PENDING)], check=True)
    text = PENDING.read_text()
    import re

    paths = set(re.findall(r"(?:tests|dev/device|dev/probes)/[\w./]+\.(?:py|sh|cu)", text))
    assert {"tests/test_gemm_sm89.py", "tests/test_fp4_native.py", "tests/test_tune.py",
            "dev/device/sanitize_rows.py", "dev/probes/mma_fp8_rate.py"} <= paths
    assert all((ROOT / p).exists() for p in paths), sorted(p for p in paths if not (ROOT / p).exists())
    for module in re.findall(r"-m (benchmarks\.\w+)", text):
        assert (ROOT / (module.replace(".", "/") + ".py")).exists(), module
    assert 'ARCHS="8.9;9.0a"' in text and 'build_extension "$ARCHS"' in text and ". dev/device/lib.sh" in text
    assert 'TORCH_CUDA_ARCH_LIST="$archs"' in LIB.read_text()


def _run_pending(tmp_path: Path, fake_body: str) -> tuple[int, str, list[str], str]:
    tree = tmp_path / "tree"
    (tree / "dev" / "device").mkdir(parents=True)
    shutil.copy(PENDING, tree / "dev" / "device" / "h200_pending.sh")
    shutil.copy(LIB, tree / "dev" / "device" / "lib.sh")
    shutil.copy(VK_SH, tree / "dev" / "device" / "vllm_bundle.sh")
    shutil.copy(FI_SH, tree / "dev" / "device" / "flashinfer_site.sh")
    shutil.copy(PREBUILT, tree / "dev" / "device" / "prebuilt.sh")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("nvidia-smi", "compute-sanitizer"):  # stand-ins: print and succeed
        (bin_dir / tool).write_text('#!/bin/bash\necho "fake $0 $*"\n')
        (bin_dir / tool).chmod(0o755)
    fake = tmp_path / "fakepy.sh"
    fake.write_text("#!/bin/bash\n" + fake_body + "\n")
    fake.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, OUT=str(out), PYTHON=str(fake), VK_ENV=str(tmp_path / "no_bundle.sh"),
               PATH=f"{bin_dir}:{os.environ['PATH']}", BUDGET_S="120")
    proc = subprocess.run(["bash", str(tree / "dev" / "device" / "h200_pending.sh")], env=env,
                          capture_output=True, text=True, timeout=120)
    archive = out / "pending.tgz"
    assert archive.exists(), proc.stdout + proc.stderr
    with tarfile.open(archive) as t:
        names = t.getnames()
        summary = t.extractfile("pending/summary.txt").read().decode()
    assert not (out / "pending").exists()
    return proc.returncode, proc.stdout, names, summary


def test_pending_script_runs_every_step_and_fails_loudly_without_vllm(tmp_path):
    rc, log, names, summary = _run_pending(tmp_path, "exit 0")
    for step in ("build", "tests", "memcheck", "racecheck", "mma_probe", "bench"):
        assert any(line.startswith(step) for line in summary.splitlines()), (step, summary)
        assert f"pending/{step}.log" in names
    assert "DEGRADED: no vLLM bundle" in summary
    assert rc == 1 and "FAILED or incomplete" in log  # no peers: the call does not pass


def test_pending_script_stops_when_the_sm89_table_is_not_built(tmp_path):
    # Every python call fails: the build "succeeds" (fake pip) but the extension check does not.
    rc, log, names, summary = _run_pending(tmp_path, 'case "$*" in *build_info*) exit 1 ;; *) exit 0 ;; esac')
    assert rc == 1 and "no extension with the SM89 GEMM table" in summary
    assert not any(line.startswith("tests") for line in summary.splitlines())


# ---- dev/device/h200_tune.sh -------------------------------------------------------------------------------------


TUNE_SH = ROOT / "dev" / "device" / "h200_tune.sh"


def test_tune_script_parses_and_its_paths_exist():
    import re

    for script in (TUNE_SH, LIB):
        subprocess.run(["bash", "-n", str(script)], check=True)
    text = TUNE_SH.read_text()
    paths = set(re.findall(r"(?:benchmarks|dev/device)/[\w./]+\.(?:py|sh)", text))
    assert {"benchmarks/serving/make_qwen3_8b.py", "dev/device/lib.sh"} <= paths
    assert all((ROOT / p).exists() for p in paths), sorted(p for p in paths if not (ROOT / p).exists())
    modules = set(re.findall(r"-m ((?:benchmarks|vllm_blockfp8)[\w.]*)", text))
    assert modules == {"benchmarks.bench_tune_ab", "vllm_blockfp8"}, modules
    # The package as installed (CI's second run imports the wheel, from a tree without vllm_blockfp8/).
    assert importlib.util.find_spec("vllm_blockfp8.__main__") is not None
    assert (ROOT / "benchmarks" / "bench_tune_ab.py").exists()
    assert "-m vllm_blockfp8 tune" in text and "build_extension" in text


def _run_tune(tmp_path: Path, fake_body: str, *stages: str, **env_extra) -> tuple[int, str, list[str], str]:
    tree = tmp_path / "tree"
    (tree / "dev" / "device").mkdir(parents=True)
    (tree / "vllm_blockfp8" / "csrc").mkdir(parents=True)
    (tree / "vllm_blockfp8" / "_C.abi3.so").write_text("")
    (tree / "setup.py").write_text("")
    for script in (TUNE_SH, LIB, PREBUILT, FI_SH, VK_SH):
        shutil.copy(script, tree / "dev" / "device" / script.name)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text('#!/bin/bash\necho "fake H200, 580.0"\n')
    (bin_dir / "nvidia-smi").chmod(0o755)
    fake = tmp_path / "fakepy.sh"
    fake.write_text("#!/bin/bash\n" + fake_body + "\n")
    fake.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, OUT=str(out), PYTHON=str(fake), PATH=f"{bin_dir}:{os.environ['PATH']}",
               TUNE_WORK=str(tmp_path / "work"))
    env.update({"BUDGET_S": "120", **env_extra})
    proc = subprocess.run(["bash", str(tree / "dev" / "device" / "h200_tune.sh"), *stages], env=env,
                          capture_output=True, text=True, timeout=120)
    names, summary = [], ""
    if (out / "tune.tgz").exists():
        with tarfile.open(out / "tune.tgz") as t:
            names = t.getnames()
            summary = t.extractfile("tune/summary.txt").read().decode()
        assert not (out / "tune").exists()
    return proc.returncode, proc.stdout, names, summary


# The fake interpreter: `tune` writes its --out file (the last argument) and says where it ran, the A/B prints its
# verdict.
_FAKE_TOOLS = """case "$*" in
  *" tune "*) for a; do :; done; echo '{"version": 1}' > "$a"; echo "wrote $a: 48 points measured, 2 override(s)"
    echo "interpreter $0 in $PWD, PYTHONPATH=${PYTHONPATH:-unset}" ;;
  *bench_tune_ab*) echo "tune_ab: PASS" ;;
  *) exit 0 ;;
esac"""


def test_tune_script_runs_every_step_and_prints_the_table_last(tmp_path):
    rc, log, names, summary = _run_tune(tmp_path, _FAKE_TOOLS)
    assert rc == 0, log
    for step in ("build", "ckpt", "wheel", "tune", "ab"):
        assert any(line.startswith(step) for line in summary.splitlines()), (step, summary)
    # tune ran as a user of the wheel runs it: outside the tree, only the wheel's install on PYTHONPATH.
    assert f"in /tmp, PYTHONPATH={tmp_path / 'work' / 'wheel_site'}" in log, log
    for f in ("tune/build.log", "tune/ckpt.log", "tune/tune.log", "tune/ab.log", "tune/blockfp8_tuned.json",
              "tune/gpu.txt", "tune/summary.txt"):
        assert f in names, (f, names)
    tail = log.rstrip().splitlines()
    assert tail[-1] == "tune run: every step passed"
    assert "tune_ab: PASS" in tail and any(x.startswith("tune wall time: ") and "(target <= 300 s)" in x for x in tail)
    assert (tmp_path / "work" / "blockfp8_tuned.json").exists()  # kept for a following `h200_tune.sh ab`
    [ab_line] = [x for x in log.splitlines() if x.startswith("== ab ")]
    budget = int(ab_line.split("--time-budget-s ")[1].split()[0])
    assert 0 < budget <= 120 - 20 - 45  # the points stop 45 s before the call's end


def test_tune_script_skips_an_ab_with_too_little_time_left(tmp_path):
    rc, log, _, summary = _run_tune(tmp_path, _FAKE_TOOLS, BUDGET_S="100")
    assert rc == 1 and "h200_tune.sh ab` next" in summary and "== ab " not in log


def test_tune_script_fails_loudly(tmp_path):
    # A tune slower than its target fails the call, though the A/B ran.
    slow = _FAKE_TOOLS.replace('*" tune "*) ', '*" tune "*) sleep 2; ')
    rc, log, _, summary = _run_tune(tmp_path / "a", slow, TUNE_TARGET_S="1")
    assert rc == 1 and "TARGET MISSED" in summary and "FAILED or incomplete" in log
    # A failed tune leaves no file: the A/B says so instead of timing a stale one.
    rc, _, _, summary = _run_tune(tmp_path / "b", 'case "$*" in *" tune "*) exit 3 ;; *) exit 0 ;; esac')
    assert rc == 1 and "no tuned file" in summary and any(x.startswith("tune") and "rc=3" in x
                                                          for x in summary.splitlines())
    # The A/B's verdict is the step's status.
    rc, _, _, summary = _run_tune(tmp_path / "c", 'case "$*" in *bench_tune_ab*) exit 1 ;; *) exit 0 ;; esac', "ab",
                                  TUNED_FILE=str(ROOT / "pyproject.toml"))
    assert rc == 1 and any(x.startswith("ab") and "rc=1" in x for x in summary.splitlines())
    # No usable extension: nothing else runs.
    rc, _, _, summary = _run_tune(tmp_path / "d", 'case "$*" in *build_info*) exit 1 ;; *) exit 0 ;; esac')
    assert rc == 1 and "kernels cannot run here" in summary
    assert not any(x.startswith("ckpt") for x in summary.splitlines())
    rc, log, names, _ = _run_tune(tmp_path / "e", "exit 0", "bogus")
    assert rc == 2 and "unknown stage 'bogus'" in log and not names
    assert not (tmp_path / "e" / "out" / "tune").exists()  # refused before anything was made


FULL = ROOT / "dev" / "device" / "h200_full.sh"
SUITE = ROOT / "dev" / "device" / "suite.py"

_SUITE_TESTS = '''
import os, pytest
def test_ok(): pass
def test_crash(): os.abort()
def test_after_the_crash(): pass
@pytest.mark.skip(reason="needs a GPU run: the compiled extension vllm_blockfp8._C is not loaded")
def test_degraded(): pass
@pytest.mark.skip(reason="needs a GPU run: the GPU is SM90, this needs SM120")
def test_other_arch(): pass
def test_fail(): assert 1 == 2, "boom"
'''


@pytest.mark.parametrize("jobs", [1, 2])
def test_suite_survives_a_crash_names_it_and_fails_on_degraded_skips(tmp_path, jobs):
    """suite.py records a test that kills the interpreter as CRASHED, runs the tests after it, and fails the run for
    a failure, a crash, or a skip a GPU run must not have (a missing extension), but not for another arch's skip."""
    (tmp_path / "tests").mkdir()
    for name in ("test_a.py", "test_b.py"):
        (tmp_path / "tests" / name).write_text(_SUITE_TESTS)
    res = subprocess.run([sys.executable, str(SUITE), "--jobs", str(jobs), "--json", str(tmp_path / "out.json"),
                          "tests/test_a.py", "tests/test_b.py"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 1, res.stdout + res.stderr
    out = json.loads((tmp_path / "out.json").read_text())["results"]
    for f in ("test_a.py", "test_b.py"):
        assert out[f"tests/{f}::test_crash"]["outcome"] == "crashed"
        assert out[f"tests/{f}::test_after_the_crash"]["outcome"] == "passed"
        assert out[f"tests/{f}::test_fail"]["outcome"] == "failed" and "boom" in out[f"tests/{f}::test_fail"]["reason"]
    assert "suite: 4 passed, 2 failed, 2 crashed, 4 skipped (2 for an unexpected reason)" in res.stdout
    assert "UNEXPECTED Skipped: needs a GPU run: the compiled extension" in res.stdout
    assert "UNEXPECTED Skipped: needs a GPU run: the GPU is SM90" not in res.stdout


def test_suite_fails_when_pytest_fails_outside_any_test(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_broken.py").write_text("import no_such_module_here\n")
    res = subprocess.run([sys.executable, str(SUITE), "tests/test_broken.py"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 1 and "<pytest exit" in res.stdout, res.stdout + res.stderr


def test_full_script_parses_and_its_paths_exist():
    subprocess.run(["bash", "-n", str(FULL)], check=True)
    text = FULL.read_text()
    assert "dev/device/suite.py" in text and "dev/device/sanitize_rows.py" in text and ". dev/device/lib.sh" in text
    for test_file in ("tests/test_vllm_gpu.py",):
        assert test_file in text and (ROOT / test_file).exists()


def test_full_script_runs_its_parts_side_by_side_and_passes_only_when_all_pass(tmp_path):
    """h200_full.sh after the build: kernels, vllm and memcheck at the same time (each fake part takes 3 s; run one
    after another they would take 9), a summary row each, and the verdict last; one failing part fails the call."""
    tree = tmp_path / "tree"
    (tree / "dev" / "device").mkdir(parents=True)
    (tree / "tests").mkdir()
    (tree / "vllm_blockfp8" / "csrc").mkdir(parents=True)
    (tree / "setup.py").write_text("")
    (tree / "vllm_blockfp8" / "csrc" / "ops.cpp").write_text("")
    for name in ("test_a.py", "test_b.py", "test_vllm_gpu.py"):
        (tree / "tests" / name).write_text("")
    shutil.copy(FULL, tree / "dev" / "device" / "h200_full.sh")
    shutil.copy(LIB, tree / "dev" / "device" / "lib.sh")
    shutil.copy(VK_SH, tree / "dev" / "device" / "vllm_bundle.sh")
    shutil.copy(FI_SH, tree / "dev" / "device" / "flashinfer_site.sh")
    shutil.copy(PREBUILT, tree / "dev" / "device" / "prebuilt.sh")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text('#!/bin/bash\necho "fake GPU"\n')
    (bin_dir / "compute-sanitizer").write_text('#!/bin/bash\nsleep 3; echo "========= ERROR SUMMARY: 0 errors"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    bundle = tmp_path / "env.sh"
    bundle.write_text("")

    def run(suite_rc: int, *parts: str):
        fake = tmp_path / "fakepy.sh"
        fake.write_text('#!/bin/bash\ncase "$*" in *suite.py*) sleep 3; echo "suite: 1 passed, 0 failed, 0 crashed"; '
                        f'exit {suite_rc} ;; *switches.py*) sleep 3; echo "case result"; echo "gemm_none ok"; exit 0 ;; '
                        'esac\necho "vllm 0.0"\n')
        fake.chmod(0o755)
        out = tmp_path / f"out{suite_rc}{'_'.join(parts)}"
        out.mkdir()
        env = dict(os.environ, OUT=str(out), PYTHON=str(fake), VK_ENV=str(bundle),
                   PATH=f"{bin_dir}:{os.environ['PATH']}", BUDGET_S="120")
        t0 = time.time()
        proc = subprocess.run(["bash", str(tree / "dev" / "device" / "h200_full.sh"), *parts], env=env,
                              capture_output=True, text=True, timeout=120)
        with tarfile.open(out / "full.tgz") as t:
            summary = t.extractfile("full/summary.txt").read().decode()
        return proc, summary, time.time() - t0

    proc, summary, seconds = run(0)
    rows = {line.split()[0]: line for line in summary.splitlines()}
    assert all("rc=0" in rows[part] for part in ("kernels", "vllm_tests", "memcheck")), summary
    assert seconds < 8, f"the parts ran one after another ({seconds:.1f} s)"
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("full suite: every part passed"), proc.stdout
    assert "switches" not in rows, "the switches run only when asked for"
    proc, summary, seconds = run(0, "all", "switches")
    rows = {line.split()[0]: line for line in summary.splitlines()}
    assert all("rc=0" in rows[part] for part in ("kernels", "vllm_tests", "memcheck", "switches")), summary
    assert seconds < 8, f"the parts ran one after another ({seconds:.1f} s)"
    assert "gemm_none ok" in proc.stdout, "the switches table is printed with the summary"
    proc, summary, _ = run(1)
    assert proc.returncode == 1 and "full suite: FAILED or incomplete" in proc.stdout, proc.stdout


# ---- dev/device/switches.py --------------------------------------------------------------------------------------

_SWITCHES_SPEC = importlib.util.spec_from_file_location("switches", ROOT / "dev" / "device" / "switches.py")
switches = importlib.util.module_from_spec(_SWITCHES_SPEC)
_SWITCHES_SPEC.loader.exec_module(switches)

# A stand-in for the demo: what a healthy engine prints under each case's environment.
_FAKE_DEMO = r'''
import os, sys
env = os.environ.get
fmt = sys.argv[sys.argv.index("--format") + 1]
force, table, corrupt = env("BLOCKFP8_FORCE", ""), env("BLOCKFP8_GEMM_TABLE", "auto"), env("BLOCKFP8_SELF_CHECK_CORRUPT")
if force == "linear:no_such_row":
    print("ValueError: BLOCKFP8_FORCE: no linear row 'no_such_row' on this GPU; valid linear rows: gemv, w8a8_gemm, "
          "dequant_matmul", file=sys.stderr)
    sys.exit(1)
tokens = "5, 6, 7" if table == "none" or corrupt else "5, 6, 8"
if env("BLOCKFP8_SELF_CHECK") == "always":
    tail = f", failed: {corrupt} (they yield to the safe path)" if corrupt else ""
    print(f"[blockfp8] first-use check: 9 rows in a child process, {8 if corrupt else 9} passed in 4.2 s{tail}",
          file=sys.stderr)
print(f"prompt [1] -> generated [{tokens}]")
if env("BLOCKFP8_LOG_ROWS") != "0":
    if fmt == "nvfp4":
        print("[blockfp8] nvfp4 N=64 K=64 M=8 -> fp4_gemv_mma_t8", file=sys.stderr)
        print("[blockfp8] nvfp4 N=64 K=64 M=512 -> fp4_wgmma_128x256", file=sys.stderr)
    elif force == "linear:dequant_matmul":
        print("[blockfp8] linear N=64 K=64 M=512 -> dequant_matmul", file=sys.stderr)
    else:
        print("[blockfp8] linear N=64 K=64 M=512 -> w8a8_gemm", file=sys.stderr)
        if corrupt:
            print(f"[blockfp8] WARNING: W8A8 GEMM row {corrupt} failed its first-use self-check against the "
                  "reference: corrupt. The row is disabled for this process (safe path).", file=sys.stderr)
        elif table != "none":
            print(f"[blockfp8] gemm N=64 K=64 M=512 -> {'sm89' if table == 'sm89' else 'sm90'}_128x128", file=sys.stderr)
'''


# A stand-in for `vllm serve`: /health and /v1/completions over HTTP, the row lines on stderr, or the startup refusal.
_FAKE_SERVE = r'''
import http.server, json, os, sys
force = os.environ.get("BLOCKFP8_FORCE", "")
if force == "linear:no_such_row":
    print("ValueError: BLOCKFP8_FORCE: no linear row 'no_such_row' on this GPU; valid linear rows: gemv, w8a8_gemm, "
          "dequant_matmul", file=sys.stderr)
    sys.exit(1)
print(f"[blockfp8] linear N=64 K=64 M=512 -> {'dequant_matmul' if force else 'w8a8_gemm'}", file=sys.stderr, flush=True)

class Handler(http.server.BaseHTTPRequestHandler):
    def reply(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        self.reply({})
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.reply({"choices": [{"text": "", "token_ids": [5, 6]}]})
    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", int(sys.argv[sys.argv.index("--port") + 1])), Handler).serve_forever()
'''


def _fake_serve_cmd(tmp_path, body=_FAKE_SERVE):
    script = tmp_path / "fake_serve.py"
    script.write_text(body)
    return lambda model, port: [sys.executable, str(script), str(model), "--port", str(port)]


def _fake_demo_cmd(tmp_path, body=_FAKE_DEMO):
    script = tmp_path / "fake_demo.py"
    script.write_text(body)
    return lambda fmt: [sys.executable, str(script), "--format", fmt]


def test_switches_pass_on_a_healthy_engine_and_run_the_corrupt_case_last(tmp_path):
    results = switches.run_all(list(switches.CASES), 1, 60, _fake_demo_cmd(tmp_path), _fake_serve_cmd(tmp_path))
    assert [r["case"] for r in results][-1] == "corrupt_row"
    assert all(r["ok"] for r in results), [(r["case"], r["why"]) for r in results if not r["ok"]]
    (check,) = [r for r in results if r["case"] == "self_check_always"]
    assert check["note"] == "first-use check: 9 rows, 4.2 s", check


@pytest.mark.parametrize("case,breakage,why", [
    ("gemm_sm90", ("-> {'sm89' if table == 'sm89' else 'sm90'}_128x128", "-> other_128x128"), "no sm90_ GEMM row"),
    ("gemm_none", ("elif table != \"none\":", "else:"), "a W8A8 GEMM row ran"),
    ("force_linear", ("-> dequant_matmul\"", "-> gemv\""), "rows other than the forced one"),
    ("force_unknown", ("sys.exit(1)", "sys.exit(0)"), "started with an unknown forced row"),
    ("log_rows_off", ("!= \"0\"", "!= \"never\""), "row lines logged"),
    ("nvfp4_w4a16", ("-> fp4_wgmma_128x256", "-> fp4_gemv_mma_t16"), "no weight-only fp4_ GEMM row at prefill"),
    ("corrupt_row", ("\"5, 6, 7\" if table == \"none\" or corrupt", "\"5, 6, 7\" if table == \"none\""),
     "tokens differ"),
    ("corrupt_row", ("failed: {corrupt} (", "failed: other ("), "does not name"),
    ("self_check_always", ("{8 if corrupt else 9} passed", "8 passed"), "passed 8 of 9 rows"),
    ("self_check_always", ("if env(\"BLOCKFP8_SELF_CHECK\") == \"always\":", "if False:"),
     "0 first-use summary lines"),
])
def test_switches_catch_each_broken_promise(tmp_path, case, breakage, why):
    body = _FAKE_DEMO.replace(*breakage)
    assert body != _FAKE_DEMO
    names = ["gemm_sm90", "gemm_none", case] if case == "corrupt_row" else [case]
    results = {r["case"]: r for r in switches.run_all(names, 1, 60, _fake_demo_cmd(tmp_path, body))}
    assert not results[case]["ok"] and why in results[case]["why"], results[case]


@pytest.mark.parametrize("case,breakage,why", [
    ("serve_force", ("'dequant_matmul' if force else 'w8a8_gemm'", "'w8a8_gemm'"), "rows other than the forced one"),
    ("serve_force", ("self.reply({\"choices\": [{\"text\": \"\", \"token_ids\": [5, 6]}]})", "self.reply({})"),
     "exit status 1"),
    ("serve_unknown", ("    sys.exit(1)\n", ""), "answered with an unknown forced row"),
])
def test_switches_serve_cases_catch_a_broken_server(tmp_path, case, breakage, why):
    body = _FAKE_SERVE.replace(*breakage)
    assert body != _FAKE_SERVE
    (result,) = switches.run_all([case], 1, 60, _fake_demo_cmd(tmp_path), _fake_serve_cmd(tmp_path, body))
    assert not result["ok"] and why in result["why"], result


def test_switches_cli_rejects_unknown_cases_and_adds_what_corrupt_row_needs(capsys, monkeypatch):
    with pytest.raises(SystemExit):
        switches.main(["--cases", "nope"])
    assert "unknown cases ['nope']" in capsys.readouterr().err
    asked = []
    monkeypatch.setattr(switches, "run_all", lambda names, jobs, timeout: asked.extend(names) or [])
    assert switches.main(["--cases", "force_linear,corrupt_row"]) == 0
    assert asked == ["gemm_sm90", "gemm_none", "force_linear", "corrupt_row"]


_SASS_SPEC = importlib.util.spec_from_file_location("sass_opcode_counts", ROOT / "dev" / "ncu" / "sass_opcode_counts.py")
sass_counts = importlib.util.module_from_spec(_SASS_SPEC)
_SASS_SPEC.loader.exec_module(sass_counts)

# cuobjdump's layout: a prologue, a copy loop without MMA, the K loop (two HGMMA, closed by a predicated backward
# branch), an epilogue ending in the self-branch every kernel ends with.
_SASS = """
	code for sm_90a
		Function : kernel_a
	.headerflags	@"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   MOV R1, c[0x0][0x28] ;                      /* 0x0 */
        /*0010*/                   LDG.E R2, desc[UR4][R2.64] ;                /* 0x0 */
        /*0020*/                   IADD3 R3, R3, 0x1, RZ ;                     /* 0x0 */
        /*0030*/               @P0 BRA 0x20 ;                                  /* 0x0 */
        /*0040*/                   LDS.64 R16, [R6+UR4] ;                      /* 0x0 */
        /*0050*/                   HGMMA.64x64x16.F32.BF16 R24, R56, gdesc[UR8], R24, gsb0 ;  /* 0x0 */
        /*0060*/                   LOP3.LUT R4, R5, 0x81c081c0, RZ, 0xc0, !PT ;  /* 0x0 */
        /*0070*/                   HGMMA.64x64x16.F32.BF16 R24, R60, gdesc[UR8], R24, gsb0 ;  /* 0x0 */
        /*0080*/              @!P3 BRA 0x40 ;                                  /* 0x0 */
        /*0090*/                   STG.E desc[UR4][R2.64], R24 ;               /* 0x0 */
        /*00a0*/                   EXIT ;                                      /* 0x0 */
        /*00b0*/                   BRA 0xb0;                                   /* 0x0 */
		Function : kernel_b
        /*0000*/                   EXIT ;                                      /* 0x0 */
"""


def test_sass_counts_whole_kernels_and_the_main_loop():
    whole = sass_counts.counts(_SASS.splitlines())
    assert sum(whole["kernel_a"].values()) == 12 and whole["kernel_a"]["HGMMA"] == 2 and whole["kernel_a"]["BRA"] == 3
    loop = sass_counts.counts(_SASS.splitlines(), loop=True)
    # The MMA loop (0x40..0x80), not the copy loop or the trailing self-branch; a kernel without a loop counts nothing.
    assert loop["kernel_a"] == {"LDS": 1, "HGMMA": 2, "LOP3": 1, "BRA": 1}
    assert sum(loop["kernel_b"].values()) == 0


# ---- dev/device/prebuilt.sh ----------------------------------------------------------------------------------------




def _prebuilt_tree(tmp_path: Path, hash_text: str | None) -> tuple[Path, dict]:
    """A tree with setup.py, one csrc file and (unless hash_text is None) a carried .prebuilt; PYTHON is a stand-in
    that logs its arguments and fakes the unpack and the install."""
    import lzma

    tree = tmp_path / "tree"
    (tree / "dev" / "device").mkdir(parents=True)
    (tree / "vllm_blockfp8" / "csrc").mkdir(parents=True)
    shutil.copy(PREBUILT, tree / "dev" / "device" / "prebuilt.sh")
    (tree / "setup.py").write_text("# setup\n")
    (tree / "vllm_blockfp8" / "csrc" / "a.cu").write_text("// kernel\n")
    (tree / "vllm_blockfp8" / "csrc" / "NOTES.md").write_text("notes\n")  # sorts first only in the C collation
    if hash_text is not None:
        (tree / ".prebuilt").mkdir()
        (tree / ".prebuilt" / "_C.abi3.so.xz").write_bytes(lzma.compress(b"ELF"))
        (tree / ".prebuilt" / "hash").write_text(hash_text + "\n")
    fake = tmp_path / "fakepy.sh"
    fake.write_text(f'#!/bin/bash\necho "$*" >> {tmp_path}/py.log\n'
                    'case "$*" in *lzma*) printf ELF > "${@: -1}" ;; esac\nexit 0\n')
    fake.chmod(0o755)
    return tree, dict(os.environ, PYTHON=str(fake), TMPDIR=str(tmp_path))


def _source_hash(tree: Path, archs: str) -> str:
    """lib.sh's build stamp, computed as the device scripts compute it."""
    cmd = 'echo "$(cat setup.py $(find vllm_blockfp8/csrc -type f | LC_ALL=C sort) | sha256sum | cut -c1-16)-$0"'
    return subprocess.run(["bash", "-c", cmd, archs], cwd=tree, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_prebuilt_installs_only_a_build_of_exactly_these_sources(tmp_path):
    tree, env = _prebuilt_tree(tmp_path, None)
    want = _source_hash(tree, "8.9;9.0a")
    # The stamp prebuilt.sh writes is the one build_extension and h200_check.sh check: they ask prebuilt.sh for it.
    assert 'hash=$(bash dev/device/prebuilt.sh hash "$archs")' in LIB.read_text()
    assert 'HASH=$(bash dev/device/prebuilt.sh hash "$ARCHS")' in (ROOT / "dev" / "device" / "h200_check.sh").read_text()
    script = str(tree / "dev" / "device" / "prebuilt.sh")
    stamp = tree / "vllm_blockfp8" / ".build_stamp"

    proc = subprocess.run(["bash", script, "install", "8.9;9.0a"], env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout == "" and not stamp.exists()  # nothing carried: silent
    for lang in ("C", "C.UTF-8", "en_US.UTF-8"):  # one hash whatever the locale sorts by
        proc = subprocess.run(["bash", script, "hash", "8.9;9.0a"], env=dict(env, LANG=lang, LC_ALL=lang),
                              capture_output=True, text=True)
        assert proc.stdout.strip() == want, proc.stderr

    for other in (want.replace("-8.9;9.0a", "-9.0a"), "0" * 16 + "-8.9;9.0a"):  # other archs, other sources
        shutil.rmtree(tmp_path / "tree")
        tree, env = _prebuilt_tree(tmp_path, other)
        proc = subprocess.run(["bash", script, "install", "8.9;9.0a"], env=env, capture_output=True, text=True)
        assert proc.returncode == 0 and "compiling" in proc.stdout and not stamp.exists(), proc.stdout

    # A manifest packed from other sources: the mismatch names the file that differs.
    (tree / ".prebuilt" / "manifest").write_text(subprocess.run(
        ["bash", "-c", "sha256sum setup.py vllm_blockfp8/csrc/NOTES.md; echo 0 vllm_blockfp8/csrc/a.cu"],
        cwd=tree, capture_output=True, text=True).stdout)
    proc = subprocess.run(["bash", script, "install", "8.9;9.0a"], env=env, capture_output=True, text=True)
    assert "compiling" in proc.stdout and "vllm_blockfp8/csrc/a.cu" in proc.stdout \
        and "NOTES.md" not in proc.stdout.split("compiling", 1)[1], proc.stdout

    shutil.rmtree(tmp_path / "tree")
    tree, env = _prebuilt_tree(tmp_path, want)
    proc = subprocess.run(["bash", script, "install", "8.9;9.0a"], env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and "installed the carried build" in proc.stdout, proc.stdout + proc.stderr
    assert stamp.read_text().strip() == want
    assert (tree / "vllm_blockfp8" / "_C.abi3.so").read_bytes() == b"ELF"
    assert "-m pip install -q --no-build-isolation --no-deps -e ." in (tmp_path / "py.log").read_text()

    proc = subprocess.run(["bash", script, "bogus"], env=env, capture_output=True, text=True)
    assert proc.returncode == 2 and "usage" in proc.stderr


def test_prebuilt_pack_builds_what_it_hashes(tmp_path):
    """pack hashes the copy it built, not the tree: a source edited while the build runs leaves a hash the device will
    not install (and a message), and the next pack recompiles that source although its copy keeps an older mtime."""
    tree, env = _prebuilt_tree(tmp_path, None)
    scratch, a_cu = tmp_path / "scratch", tree / "vllm_blockfp8" / "csrc" / "a.cu"
    subprocess.run(["git", "init", "-q"], cwd=tree, check=True)
    # The stand-in build makes the library, records the copy's a.cu mtime and, when asked, edits the tree mid-build.
    fake = tmp_path / "fakebuild.sh"
    fake.write_text(f'#!/bin/bash\nmkdir -p vllm_blockfp8 && printf ELF > vllm_blockfp8/_C.abi3.so\n'
                    f'stat -c %Y vllm_blockfp8/csrc/a.cu > {tmp_path}/built_mtime\n'
                    f'[ -f {tmp_path}/edit ] && printf "// edited\\n" > {a_cu} && rm {tmp_path}/edit\nexit 0\n')
    fake.chmod(0o755)
    env = dict(env, PYTHON=str(fake), PREBUILT_SCRATCH=str(scratch))
    script = str(tree / "dev" / "device" / "prebuilt.sh")

    def pack() -> str:
        proc = subprocess.run(["bash", script, "pack", "9.0a"], cwd=tree, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    out = pack()
    assert (tree / ".prebuilt" / "hash").read_text().strip() == _source_hash(tree, "9.0a") and "changed" not in out

    (tmp_path / "edit").write_text("")
    out = pack()  # the tree moves on during the build: the hash is the copy's, and says so
    assert "the tree changed while this pack ran" in out, out
    assert (tree / ".prebuilt" / "hash").read_text().strip() != _source_hash(tree, "9.0a")

    os.utime(a_cu, (946684800, 946684800))  # the edit, copied with a time older than the last build
    out = pack()
    assert int((tmp_path / "built_mtime").read_text()) > 946684800, "the edited source was not touched"
    assert (tree / ".prebuilt" / "hash").read_text().strip() == _source_hash(tree, "9.0a") and "changed" not in out
    assert (scratch / "vllm_blockfp8" / "csrc" / "a.cu").read_text() == "// edited\n"


def test_prebuilt_pack_base_builds_a_revision(tmp_path):
    """pack-base REV builds that revision's sources, not the working tree's, into .prebuilt_base (ab_builds' base
    build), stamped with the hash the device computes for that revision's tree; the tree's own .prebuilt is left."""
    tree, env = _prebuilt_tree(tmp_path, None)
    a_cu = tree / "vllm_blockfp8" / "csrc" / "a.cu"
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base"]):
        subprocess.run(["git", *args], cwd=tree, check=True, capture_output=True)
    base_hash = _source_hash(tree, "9.0a")
    a_cu.write_text("// edited\n")
    fake = tmp_path / "fakebuild.sh"
    fake.write_text(f'#!/bin/bash\nmkdir -p vllm_blockfp8 && printf ELF > vllm_blockfp8/_C.abi3.so\n'
                    f'cp vllm_blockfp8/csrc/a.cu {tmp_path}/built_a.cu\nexit 0\n')
    fake.chmod(0o755)
    env = dict(env, PYTHON=str(fake), PREBUILT_SCRATCH=str(tmp_path / "scratch"))
    proc = subprocess.run(["bash", str(tree / "dev" / "device" / "prebuilt.sh"), "pack-base", "HEAD", "9.0a"], cwd=tree,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "built_a.cu").read_text() == "// kernel\n", "built the working tree, not the revision"
    assert (tree / ".prebuilt_base" / "hash").read_text().strip() == base_hash != _source_hash(tree, "9.0a")
    assert (tree / ".prebuilt_base" / "_C.abi3.so.xz").exists() and not (tree / ".prebuilt").exists()
    assert "packed .prebuilt_base from HEAD" in proc.stdout


def _fake_wheel(folder: Path, version: str) -> None:
    """A minimal flashinfer-python wheel pip installs offline."""
    import zipfile
    info = f"flashinfer_python-{version}.dist-info"
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / f"flashinfer_python-{version}-py3-none-any.whl", "w") as z:
        z.writestr("flashinfer/__init__.py", f"__version__ = {version!r}\n")
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: flashinfer-python\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")


def _use_flashinfer(tree: Path, site: Path, **env) -> tuple[str, str]:
    """(PYTHONPATH, FLASHINFER_NOTE) after sourcing flashinfer_site.sh in tree and calling use_flashinfer."""
    script = f'. {FI_SH}; use_flashinfer; echo "$PYTHONPATH"; echo "$FLASHINFER_NOTE"'
    run = subprocess.run(["bash", "-c", script], cwd=tree, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PY=sys.executable, FI_SITE=str(site), PYTHONPATH="/base", **env))
    assert run.returncode == 0, run.stderr
    path, note = run.stdout.strip().splitlines()[-2:]
    return path, note


def test_flashinfer_carried_once_stays_on_the_path_of_later_calls(tmp_path):
    """The call that carries .fi installs it (with the AOT module); a later call on the warm machine, whose tree no
    longer holds .fi, still runs vLLM with it; FLASHINFER=0 leaves it out; a machine that never got it says so."""
    site = tmp_path / "fi_site"
    first, later = tmp_path / "first", tmp_path / "later"
    _fake_wheel(first / ".fi", "0.6.14")
    (first / ".fi" / "aot").mkdir()
    (first / ".fi" / "aot" / "fp8_blockscale_gemm_90.so").write_text("so")
    later.mkdir()
    path, note = _use_flashinfer(later, site)
    assert path == "/base" and "absent" in note
    path, note = _use_flashinfer(first, site)
    assert (site / "flashinfer" / "__init__.py").exists()
    assert (site / "flashinfer" / "data" / "aot" / "fp8_blockscale_gemm_90" / "fp8_blockscale_gemm_90.so").exists()
    assert path == f"{site}:/base" and "0.6.14" in note and "with the AOT" in note
    path, note = _use_flashinfer(later, site)
    assert path == f"{site}:/base" and "0.6.14" in note
    path, note = _use_flashinfer(later, site, FLASHINFER="0")
    assert path == "/base" and "left out" in note


# ---- dev/device/vllm_bundle.sh -----------------------------------------------------------------------------------


def _vllm_bundle(tree: Path, root: Path) -> tuple[int, str]:
    """(vllm_bundle's status, BUNDLE_MARK as its environment left it) after sourcing vllm_bundle.sh in tree."""
    script = f'. {VK_SH}; vllm_bundle; rc=$?; echo "$rc ${{BUNDLE_MARK:-unset}}"'
    run = subprocess.run(["bash", "-c", script], cwd=tree, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PY=sys.executable, VK_ROOT=str(root)))
    assert run.returncode == 0, run.stderr
    rc, mark = run.stdout.strip().splitlines()[-1].split()
    return int(rc), mark


def test_vllm_bundle_carried_once_is_sourced_by_later_calls(tmp_path):
    """The call carrying .vk (the kit split in parts, as fetch_device_wheels.sh writes it) unpacks it and sources
    its environment; a later call on the warm machine, whose tree no longer holds .vk, sources it again without
    unpacking; a machine that never got it answers 1 (h200_check.sh then says its vLLM peers are skipped: without
    this, bench_nvfp4 on a fresh machine silently ran without its Marlin peer)."""
    root = tmp_path / "machine_tmp"
    root.mkdir()
    first, later = tmp_path / "first", tmp_path / "later"
    later.mkdir()
    assert _vllm_bundle(later, root) == (1, "unset")
    kit = tmp_path / "kit.tar"
    env_sh = tmp_path / "env.sh"
    env_sh.write_text("export BUNDLE_MARK=sourced\n")
    with tarfile.open(kit, "w") as t:
        t.add(env_sh, arcname="vk_tools/env.sh")
    data = kit.read_bytes()
    (first / ".vk").mkdir(parents=True)
    half = len(data) // 2
    (first / ".vk" / "kit.part-00").write_bytes(data[:half])
    (first / ".vk" / "kit.part-01").write_bytes(data[half:])
    assert _vllm_bundle(first, root) == (0, "sourced")
    assert (root / "vk_tools" / "env.sh").exists() and not (root / "kit.bin").exists()
    (root / "vk_tools" / "env.sh").write_text("export BUNDLE_MARK=kept\n")  # a second unpack would overwrite it
    assert _vllm_bundle(later, root) == (0, "kept")
    assert _vllm_bundle(first, root) == (0, "kept")
    check = (ROOT / "dev" / "device" / "h200_check.sh").read_text()
    assert check.index("vllm_bundle") < check.index("pip install"), "unpack before the wheels go into the same site"


def _setup_function(name: str):
    """One top-level function of setup.py, without running setup.py (importing it would build the package)."""
    import ast

    tree = ast.parse((ROOT / "setup.py").read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    scope = {"Path": Path}
    exec(compile(ast.Module([node], []), "setup.py", "exec"), scope)
    return scope[name]


def test_an_arch_unit_is_stale_only_when_a_file_it_includes_changed(tmp_path):
    """setup.py's freshness rule for the CUTLASS / mma.sync units: the newest file in nvcc's -MD list, the newest
    csrc header before a unit has one, and a listed file that is gone forces a rebuild."""
    newest = _setup_function("_newest_dependency")
    old, new, other = tmp_path / "old.cuh", tmp_path / "new.cuh", tmp_path / "not_included.cuh"
    for i, f in enumerate((old, new, other)):
        f.write_text("")
        os.utime(f, (1000 + 100 * i, 1000 + 100 * i))
    deps = tmp_path / "unit.sm90a.d"
    assert newest(deps, 42.0) == 42.0  # no list yet: the caller's fallback
    deps.write_text(f"{tmp_path}/unit.sm90a.o : {old} \\\n    {new}\n")
    assert newest(deps, 42.0) == 1100  # other.cuh (1200) is not in the list
    os.utime(old, (5000, 5000))
    assert newest(deps, 42.0) == 5000
    new.unlink()
    assert newest(deps, 42.0) == float("inf")
