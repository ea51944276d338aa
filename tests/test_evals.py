"""The eval drivers' bookkeeping (CPU): what counts as a finished worker, and which error is named.

Both behaviours were learned on the H200: vLLM 0.26 workers that had written every result still
died with rc -6 in interpreter teardown, and vLLM's block-FP8 path refusing SmolLM2 (K = 576)
showed up only as "Engine core initialization failed" at the tail of the log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from evals import collect, root_cause

# The shape of a real failure log from the H200 run (engine core first, then the front end).
VLLM_REFUSAL_LOG = """\
(EngineCore pid=5162) INFO 11-29 23:21:26 [__init__.py:604] Selected DeepGemmFp8BlockScaledMMKernel
(EngineCore pid=5162) ERROR 11-29 23:21:30 [core.py:1330] EngineCore failed to start.
(EngineCore pid=5162) ERROR 11-29 23:21:30 [core.py:1330]     assert x.shape[-1] % group_size == 0, (
(EngineCore pid=5162) ERROR 11-29 23:21:30 [core.py:1330] AssertionError: the last dimension of `x` 576 \
must be divisible by `group_size` 128
Traceback (most recent call last):
  File "/tmp/site/vllm/v1/engine/utils.py", line 1272, in wait_for_engine_startup
    raise RuntimeError(
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""


def _worker_files(tmp_path: Path, log_text: str, with_result: bool) -> tuple[Path, Path]:
    js, log = tmp_path / "v.json", tmp_path / "v.log"
    log.write_text(log_text)
    if with_result:
        js.write_text(json.dumps({"variant": "blockfp8", "metrics": {"acc,none": 0.66}}))
    return js, log


def test_root_cause_names_the_engine_core_error_not_the_front_end_one(tmp_path):
    log = tmp_path / "x.log"
    log.write_text(VLLM_REFUSAL_LOG)
    cause = root_cause(log)
    assert cause.startswith("AssertionError: the last dimension of `x` 576"), cause


def test_root_cause_falls_back_to_the_tail(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("starting\nKilled\n")
    assert root_cause(log) == "starting | Killed"
    assert root_cause(tmp_path / "missing.log") == ""


def test_collect_accepts_a_worker_that_aborts_after_writing_results(tmp_path):
    js, log = _worker_files(tmp_path, "WORKER OK blockfp8: {}\nterminate called without an active exception\n",
                            with_result=True)
    rec, status = collect(-6, js, log, 42.0, "blockfp8")
    assert rec is not None and rec["metrics"]["acc,none"] == 0.66
    assert status.startswith("ok (42s; exit rc=-6"), status


def test_collect_refuses_results_without_the_ok_line_or_file(tmp_path):
    js, log = _worker_files(tmp_path, "terminate called without an active exception\n", with_result=True)
    rec, status = collect(-6, js, log, 1.0, "blockfp8")
    assert rec is None and status.startswith("rc=-6")
    # The OK line of another variant does not count either.
    js, log = _worker_files(tmp_path, "WORKER OK bf16: {}\n", with_result=True)
    assert collect(-6, js, log, 1.0, "blockfp8")[0] is None
    js.unlink()
    js, log = _worker_files(tmp_path, "WORKER OK blockfp8: {}\n", with_result=False)
    assert collect(0, js, log, 1.0, "blockfp8")[0] is None


def test_collect_names_timeouts_and_root_causes(tmp_path):
    js, log = _worker_files(tmp_path, VLLM_REFUSAL_LOG, with_result=False)
    rec, status = collect(1, js, log, 9.0, "vllm-fp8-block")
    assert rec is None and "AssertionError" in status and "576" in status
    rec, status = collect(124, js, log, 150.0, "vllm-fp8-block")
    assert rec is None and status.startswith("timeout after 150s")


def test_finish_worker_exits_with_the_code_and_keeps_output():
    code = "from evals import finish_worker; print('WORKER OK x', flush=False); finish_worker(3)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1], timeout=60)
    assert proc.returncode == 3
    assert "WORKER OK x" in proc.stdout


def _fidelity(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evals.fidelity", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_fidelity_needs_its_reference_among_the_variants(tmp_path):
    root = Path(__file__).resolve().parents[1]
    common = ["--bf16", str(tmp_path / "b"), "--fp8block", str(tmp_path / "f"), "--out", str(tmp_path / "o")]
    r = _fidelity(*common, "--variants", "blockfp8,blockfp8-tp2", cwd=root)
    assert r.returncode == 2 and "the reference 'bf16' must be one of them" in r.stderr, r.stderr
    r = _fidelity(*common, "--variants", "blockfp8,blockfp8-tp3", "--reference", "blockfp8", cwd=root)
    assert r.returncode == 2 and "unknown variants ['blockfp8-tp3']" in r.stderr, r.stderr


def test_tensor_parallel_variant_is_ours_and_shards_the_engine():
    from evals import OWN_VARIANTS, VARIANTS, llm_kwargs

    v = VARIANTS["blockfp8-tp2"]
    assert (v.checkpoint, v.quantization, v.tensor_parallel) == ("fp8block", "blockfp8", 2)
    assert "blockfp8-tp2" in OWN_VARIANTS, "a failing tensor-parallel run of our path must fail the driver"
    kw = llm_kwargs("m", v.quantization, gpu_mem=0.3, eager=True, max_model_len=64,
                    tensor_parallel_size=v.tensor_parallel)
    assert kw["tensor_parallel_size"] == 2 and kw["quantization"] == "blockfp8"
    assert all(VARIANTS[n].tensor_parallel == 1 for n in VARIANTS if not n.endswith("-tp2"))
    base = VARIANTS["bf16-tp2"]
    assert (base.checkpoint, base.quantization, base.tensor_parallel) == ("bf16", None, 2)
    assert "bf16-tp2" in OWN_VARIANTS


def test_clustered_standard_error():
    from evals.fidelity import clustered_mean

    mean, se = clustered_mean([[1.0, 1.0], [3.0, 3.0]])
    assert mean == 2.0 and abs(se - 8 ** 0.5 / 4) < 1e-12  # two clusters of two, each 1 from the mean
    # Values repeated inside a cluster are not more evidence: the same two clusters, 5 values each.
    assert abs(clustered_mean([[1.0] * 5, [3.0] * 5])[1] - se) < 1e-12
    assert clustered_mean([[1.0, 2.0]])[1] != clustered_mean([[1.0, 2.0]])[1]  # one cluster: NaN, no claim
    assert clustered_mean([])[0] != clustered_mean([])[0]


def _record(dists):
    """A worker record: one prompt per entry of dists, each a list of {token: log-prob} positions."""
    return {"prompts": [{"prompt_ids": [i], "greedy": [0], "positions": [[[t, lp] for t, lp in d.items()] for d in ps]}
                        for i, ps in enumerate(dists)]}


def test_paired_comparison_tells_equal_from_different():
    import math

    from evals.fidelity import compare, paired

    def dist(p0):
        return {0: math.log(p0), 1: math.log(1 - p0)}

    ref = _record([[dist(0.7), dist(0.6)], [dist(0.8), dist(0.55)], [dist(0.65), dist(0.75)]])
    same = paired(ref, ref, ref, 2)
    assert same["kl_diff"] == 0 and same["equal"]
    shifted = _record([[dist(0.5), dist(0.4)], [dist(0.6), dist(0.35)], [dist(0.45), dist(0.55)]])
    worse = paired(ref, shifted, ref, 2)
    assert worse["kl_diff"] > 0 and not worse["equal"], worse  # every position moved the same way
    # A prompt one variant tokenized differently leaves only that prompt out: the others still pair up.
    retokenized = _record([[dist(0.5), dist(0.4)], [dist(0.6), dist(0.35)], [dist(0.45), dist(0.55)]])
    retokenized["prompts"][0]["prompt_ids"] = [99]
    other = _record([[dist(0.9), dist(0.6)], [dist(0.8), dist(0.5)], [dist(0.3), dist(0.75)]])  # differs per prompt
    skip_first = paired(ref, retokenized, other, 2)
    tail = paired(_record([[dist(0.8), dist(0.55)], [dist(0.65), dist(0.75)]]),
                  _record([[dist(0.6), dist(0.35)], [dist(0.45), dist(0.55)]]),
                  _record([[dist(0.8), dist(0.5)], [dist(0.3), dist(0.75)]]), 2)
    assert abs(skip_first["kl_diff"] - tail["kl_diff"]) < 1e-12, (skip_first, tail)
    row = compare(ref, shifted, 2)
    assert row["kl_se"] > 0 and row["top1"] <= 1 and row["top1_se"] == row["top1_se"]


def test_sm89_variant_runs_our_path_with_the_sm89_table(monkeypatch, tmp_path):
    import evals
    from evals import OWN_VARIANTS, VARIANTS

    v = VARIANTS["blockfp8-sm89"]
    assert (v.checkpoint, v.quantization, dict(v.env)) == ("fp8block", "blockfp8", {"BLOCKFP8_GEMM_TABLE": "sm89"})
    assert "blockfp8-sm89" in OWN_VARIANTS
    seen = {}

    class FakePopen:
        def __init__(self, cmd, env, **kw):
            seen.update(env)
            self.pid = 0

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(evals.subprocess, "Popen", FakePopen)
    monkeypatch.delenv("BLOCKFP8_GEMM_TABLE", raising=False)
    assert evals.run_worker(["x"], tmp_path / "log", 5, v.env)[0] == 0
    assert seen["BLOCKFP8_GEMM_TABLE"] == "sm89"  # the worker's environment only, not the driver's
    assert "BLOCKFP8_GEMM_TABLE" not in os.environ


def test_paired_needs_two_recorded_variants(tmp_path):
    root = Path(__file__).resolve().parents[1]
    common = ["--bf16", str(tmp_path / "b"), "--fp8block", str(tmp_path / "f"), "--out", str(tmp_path / "o")]
    r = _fidelity(*common, "--variants", "bf16,blockfp8", "--paired", "blockfp8-sm89:blockfp8", cwd=root)
    assert r.returncode == 2 and "--paired ['blockfp8-sm89:blockfp8']" in r.stderr, r.stderr


def test_nvfp4_variants_load_one_nvfp4_checkpoint_ours_and_vllms():
    from evals import OWN_VARIANTS, VARIANTS

    ours, theirs = VARIANTS["blockfp8-nvfp4"], VARIANTS["vllm-nvfp4"]
    assert (ours.checkpoint, ours.quantization) == ("nvfp4", "blockfp8") and "blockfp8-nvfp4" in OWN_VARIANTS
    assert (theirs.checkpoint, theirs.quantization) == ("nvfp4", None) and "vllm-nvfp4" not in OWN_VARIANTS


def test_lm_eval_refuses_variants_of_checkpoints_it_does_not_make(tmp_path):
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, "-m", "evals.run_lm_eval", "--bf16", str(tmp_path), "--fp8block",
                        str(tmp_path), "--out", str(tmp_path / "o"), "--variants", "bf16,blockfp8-nvfp4"],
                       cwd=root, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "unknown variants ['blockfp8-nvfp4']" in r.stderr, r.stderr
