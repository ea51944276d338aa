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

import pytest

from vllm_blockfp8 import demo

REASON = demo.gpu_unsupported_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"needs a supported GPU and vLLM: {REASON}")


# (format, the op family its linears log, the decode row's prefix, the prefill (M > 16) path's prefix: the W8A8
# GEMM, or an NVFP4 GEMM row rather than the GEMV)
@pytest.mark.parametrize("fmt,family,row_prefix,prefill_prefix", [("fp8-block", "linear", "gemv", "w8a8_gemm"),
                                                                  ("nvfp4", "nvfp4", "fp4_", "fp4_(?!gemv)")])
def test_llm_generates_with_cuda_graphs(fmt, family, row_prefix, prefill_prefix):
    env = {**os.environ, "BLOCKFP8_LOG_ROWS": "1"}
    cmd = [sys.executable, "-m", "vllm_blockfp8", "demo", "--format", fmt, "--max-tokens", "8"]
    if os.environ.get("BLOCKFP8_TEST_ATTENTION_BACKEND"):
        cmd += ["--attention-backend", os.environ["BLOCKFP8_TEST_ATTENTION_BACKEND"]]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
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
