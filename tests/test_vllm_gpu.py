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


@pytest.mark.parametrize("fmt,family,row_prefix", [("fp8-block", "linear", "gemv"), ("nvfp4", "nvfp4", "fp4_")])
def test_llm_generates_with_cuda_graphs(fmt, family, row_prefix):
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
