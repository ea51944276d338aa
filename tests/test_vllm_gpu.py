"""vLLM end to end on a GPU: ``vllm.LLM(..., quantization="blockfp8")`` with torch.compile and CUDA
graphs (the demo), in a fresh process per format so vLLM's global state cannot leak between runs.

What can fail here and nowhere else: an op that builds a host tensor or syncs inside the captured
region (CUDA graph capture refuses it: the NVFP4 path once did), a fake whose output disagrees with
the real op under torch.compile, or a kernel row that the engine's shapes reach but no unit test does.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

import pytest
import torch

from vllm_blockfp8 import demo

REASON = demo.gpu_unsupported_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"needs a supported GPU and vLLM: {REASON}")


def _demo_start(fmt: str, env: dict, *extra: str) -> tuple:
    """The demo engine in its own process, started; _finish waits for it. Demo engines take a fixed KV cache (no
    memory profiling), so two start side by side. Output goes to files, not pipes: an engine whose pipe nobody reads
    while the test waits on the other would stall once its logs fill the pipe."""
    cmd = [sys.executable, "-m", "vllm_blockfp8", "demo", "--format", fmt, "--max-tokens", "8", "--logprobs", "5",
           *extra]
    if os.environ.get("BLOCKFP8_TEST_ATTENTION_BACKEND"):
        cmd += ["--attention-backend", os.environ["BLOCKFP8_TEST_ATTENTION_BACKEND"]]
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env={**os.environ, "BLOCKFP8_LOG_ROWS": "1", **env})
    return proc, out, err


def _finish(started: tuple) -> subprocess.CompletedProcess:
    proc, out, err = started
    try:
        proc.wait(timeout=900)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    texts = []
    for f in (out, err):
        f.seek(0)
        texts.append(f.read())
        f.close()
    return subprocess.CompletedProcess(proc.args, proc.returncode, *texts)


# The reference path of each format: a forced row that the unit tests check against reference.py on every shape,
# and that quantizes no activations (dequantize + cuBLAS; the FMA W4A16 fallback).
REFERENCE_ROW = {"fp8-block": "linear:dequant_matmul", "nvfp4": "nvfp4:fp4_gemv_fma_anym"}


def logprob_tolerance(fmt: str) -> float:
    """Nats between our path's logprobs and the reference path's on the demo model (logits ~0.64 rms: unit-RMS hidden
    states through a 0.02-std lm_head of width 1024). The W4A16 rows compute the reference's products exactly and
    differ only by accumulation order and one bf16 rounding per layer (~2^-9 relative: ~0.002 nats; eager vs compiled
    non-linear ops add the same order): 0.05. The W8A8 prefill rounds each activation to e4m3 (~2.7% rms relative per
    element, so ~3-5% on the logits after 2 layers: ~0.03 nats rms, ~0.1 at the worst of ~25 positions): 0.25. SM120's
    native NVFP4 prefill rounds activations to E2M1 (~9.5% rms relative): 0.5. A wrong kernel moves logits by their
    own size (~1 nat) and reorders the top 5."""
    if fmt == "nvfp4":
        return 0.5 if torch.cuda.get_device_capability() == (12, 0) else 0.05
    return 0.25


# (format, the op family its linears log, the decode row's prefix, the prefill (M > 16) path's prefix: the W8A8
# GEMM, or an NVFP4 GEMM row rather than the GEMV)
@pytest.mark.parametrize("fmt,family,row_prefix,prefill_prefix", [("fp8-block", "linear", "gemv", "w8a8_gemm"),
                                                                  ("nvfp4", "nvfp4", "fp4_", "fp4_(?!gemv)")])
def test_llm_generates_with_cuda_graphs(fmt, family, row_prefix, prefill_prefix):
    # Our path and the reference path (below) run side by side: each is an engine start-up, mostly host time.
    forced_family, forced_row = REFERENCE_ROW[fmt].split(":")
    ours = _demo_start(fmt, {})
    ref_proc = _demo_start(fmt, {"BLOCKFP8_FORCE": REFERENCE_ROW[fmt]}, "--enforce-eager")
    res, ref = _finish(ours), _finish(ref_proc)
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-6000:]
    generated = re.findall(r"generated \[([0-9, ]+)\]", res.stdout)
    assert len(generated) == len(demo.PROMPTS), res.stdout[-3000:]
    assert all(len(g.split(",")) == 8 for g in generated), res.stdout[-3000:]
    # The engine's own calls (decode and prefill shapes) went through our kernels.
    assert re.search(rf"\[blockfp8\] {family} N=\d+ K=\d+ M=\d+ -> {row_prefix}", log), log[-6000:]
    # ... and the prefill went through the GEMM path (the engine's profile run and the prompts: M > 16).
    assert re.search(rf"\[blockfp8\] {family} N=\d+ K=\d+ M=(1[7-9]|[2-9]\d|\d{{3,}}) -> {prefill_prefix}", log), \
        log[-6000:]

    # The same prompts through the reference path (eager: a faster start; the linears are the same ops): every prompt
    # position's and every comparable step's logprobs agree within the format's tolerance.
    ref_log = ref.stdout + ref.stderr
    assert ref.returncode == 0, ref_log[-6000:]
    served = set(re.findall(rf"\[blockfp8\] {forced_family} N=\d+ K=\d+ M=\d+ -> (\w+)", ref_log))
    assert served == {forced_row}, f"the reference run logged rows {served}"
    worst, problems = demo.logprob_gaps(demo.parse_logprobs(res.stdout), demo.parse_logprobs(ref.stdout))
    assert not problems, problems
    assert worst <= logprob_tolerance(fmt), f"largest logprob gap to the reference path {worst:.4f} nats"
    print(f"{fmt}: largest logprob gap to the reference path {worst:.4f} nats (tolerance {logprob_tolerance(fmt)})")


def test_llm_serves_with_switches_off_and_a_garbage_tuned_file(tmp_path):
    """The documented switches that take kernels away never stop the engine: BLOCKFP8_GEMM_TABLE=none (prefill then
    runs dequantize + cuBLAS), a tuned file that is not JSON (one warning, the planner serves), and
    BLOCKFP8_SELF_CHECK=always (the isolated first-use check of every row of this GPU's tables, in a child process)."""
    garbage = tmp_path / "tuned.json"
    garbage.write_bytes(b"\x00{not json\xff")
    env = {**os.environ, "BLOCKFP8_LOG_ROWS": "1", "BLOCKFP8_GEMM_TABLE": "none",
           "BLOCKFP8_TUNED_CONFIG": str(garbage), "BLOCKFP8_SELF_CHECK": "always"}
    cmd = [sys.executable, "-m", "vllm_blockfp8", "demo", "--format", "fp8-block", "--max-tokens", "8"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-6000:]
    assert len(re.findall(r"generated \[([0-9, ]+)\]", res.stdout)) == len(demo.PROMPTS), res.stdout[-3000:]
    assert log.count(f"ignoring the tuned config {garbage}") == 1, log[-6000:]
    assert re.search(r"\[blockfp8\] linear N=\d+ K=\d+ M=(1[7-9]|[2-9]\d|\d{3,}) -> dequant_matmul", log), log[-6000:]
    assert not re.search(r"-> (sm90_|sm89_)", log), "a W8A8 GEMM row ran under BLOCKFP8_GEMM_TABLE=none"
