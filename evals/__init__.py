"""Model-level checks of vllm_blockfp8: fidelity against bf16 and lm-eval accuracy.

Run from the repository root as modules (``python -m evals.fidelity``, ``python -m
evals.run_lm_eval``). Each variant runs in its own subprocess: vLLM engines do not always free all
GPU memory when deleted, and one variant that fails to load must not take the others down.

A *variant* is one way to run the same weights (VARIANTS below). ``bf16`` is the reference.
A driver exits 1 when one of OWN_VARIANTS fails; a peer that refuses the model (vLLM's block-FP8
path on SmolLM2's 576-wide projections) is reported in the table and does not fail the run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Variant:
    name: str
    checkpoint: str  # "bf16", "fp8block", "nvfp4" or "dequant": which directory the variant loads
    quantization: str | None  # the --quantization argument; None lets vLLM read the config
    what: str
    tensor_parallel: int = 1  # GPUs the engine shards the model over (block scales shard with it)
    env: tuple = ()  # (name, value) pairs set in the variant's worker process only


VARIANTS = {
    v.name: v
    for v in (
        Variant("bf16", "bf16", None, "bf16 checkpoint, no quantization (the reference)"),
        Variant("blockfp8", "fp8block", "blockfp8", "block-FP8 checkpoint through this plugin"),
        Variant("vllm-fp8-block", "fp8block", None,
                "block-FP8 checkpoint through vLLM's own fp8 block path"),
        Variant("vllm-fp8-dyn", "bf16", "fp8",
                "bf16 checkpoint, vLLM online fp8 (per-tensor weights, dynamic activations)"),
        Variant("bf16-dequant", "dequant", None,
                "block-FP8 weights dequantized to bf16: the weight-rounding error alone"),
        Variant("blockfp8-tp2", "fp8block", "blockfp8",
                "block-FP8 checkpoint through this plugin, tensor parallel 2 (needs 2 GPUs)",
                tensor_parallel=2),
        Variant("bf16-tp2", "bf16", None,
                "bf16 at tensor parallel 2 (needs 2 GPUs): what sharding alone moves, the yardstick "
                "for blockfp8-tp2 against blockfp8", tensor_parallel=2),
        Variant("blockfp8-nvfp4", "nvfp4", "blockfp8", "ModelOpt NVFP4 checkpoint through this plugin"),
        Variant("vllm-nvfp4", "nvfp4", None,
                "ModelOpt NVFP4 checkpoint through vLLM's own path (Marlin W4A16 on Hopper and Ada)"),
        Variant("blockfp8-sm89", "fp8block", "blockfp8",
                "block-FP8 checkpoint through this plugin with the SM89 W8A8 GEMM table forced (its rows are "
                "compiled for sm_90a too): the Ada GEMM's numerics on an H100/H200",
                env=(("BLOCKFP8_GEMM_TABLE", "sm89"),)),
    )
}

OWN_VARIANTS = ("bf16", "blockfp8", "bf16-dequant", "blockfp8-tp2", "bf16-tp2", "blockfp8-sm89", "blockfp8-nvfp4")

# vLLM settings shared by every variant (the offline bundle runs TRITON_ATTN on the H200).
ATTENTION_BACKEND = os.environ.get("BLOCKFP8_EVAL_ATTN", "TRITON_ATTN")


def llm_kwargs(model: str, quantization: str | None, *, gpu_mem: float, eager: bool,
               max_model_len: int, **extra) -> dict:
    """Arguments of vllm.LLM for one variant; identical apart from model and quantization."""
    kw = dict(model=model, quantization=quantization, dtype="bfloat16", seed=0,
              max_model_len=max_model_len, gpu_memory_utilization=gpu_mem,
              enforce_eager=eager, attention_config={"backend": ATTENTION_BACKEND})
    kw.update(extra)
    return kw


def run_worker(args: list[str], log: Path, timeout_s: float, env_extra: tuple = ()) -> tuple[int, float]:
    """Run ``python -m <args>`` with a wall-clock cap (``env_extra``: (name, value) pairs added to its environment);
    (returncode, seconds). 124 on timeout."""
    t0 = time.time()
    env = dict(os.environ, **dict(env_extra))
    env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")  # FlashInfer is not in the offline bundle
    # Accuracy runs do not need DeepGEMM's start-up JIT of every M bucket (vLLM's block-FP8 path
    # on Hopper); kernels still compile on first use, only for the shapes these runs meet.
    env.setdefault("VLLM_DEEP_GEMM_WARMUP", "skip")
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", *args], stdout=f,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
        # dev/device/h200_e2e.sh ends, by id, what a killed driver leaves behind.
        if os.environ.get("BLOCKFP8_PIDFILE"):
            with open(os.environ["BLOCKFP8_PIDFILE"], "a") as pf:
                pf.write(f"{proc.pid}\n")
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            # The engine core is a child of the worker: end the whole session we started.
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = 124
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    return rc, time.time() - t0


def tail(path: Path, n: int = 3) -> str:
    """Last n non-empty lines of a log, joined: the error line that ends a failed worker."""
    if not path.exists():
        return ""
    lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    return " | ".join(lines[-n:])[-400:]


# "SomeError: message" at the end of a log line (vLLM prefixes engine-core lines with a process tag).
_ERROR_LINE = re.compile(r"\b([A-Za-z_.]*(?:Error|Exception)): (.+)$")
# What the front end raises about a failed engine core: a consequence, never the cause.
_CONSEQUENCES = ("Engine core initialization failed",)


def root_cause(path: Path) -> str:
    """The first exception line of a log that is not a known consequence of an earlier one.

    A vLLM engine that fails to start prints the real error (say an AssertionError in a kernel
    wrapper) in the engine-core process, then the front end raises a generic RuntimeError; the
    tail of the log only shows the latter. Falls back to tail() when no exception line is found.
    """
    if not path.exists():
        return ""
    for ln in path.read_text(errors="replace").splitlines():
        m = _ERROR_LINE.search(ln.strip())
        if m and not any(c in m.group(2) for c in _CONSEQUENCES):
            return f"{m.group(1)}: {m.group(2)}"[:400]
    return tail(path)


def collect(rc: int, js: Path, log: Path, secs: float, variant: str) -> tuple[dict | None, str]:
    """(the worker's record or None, a status line) for one finished worker.

    A worker whose result file is written and whose log says ``WORKER OK`` succeeded even if the
    process then died: on the H200, vLLM 0.26 engines sometimes abort during interpreter teardown
    ("terminate called without an active exception", rc -6) after every result is on disk.
    """
    if js.exists() and (rc == 0 or f"WORKER OK {variant}" in log.read_text(errors="replace")):
        note = "" if rc == 0 else f"; exit rc={rc} after writing results (vLLM teardown)"
        return json.loads(js.read_text()), f"ok ({secs:.0f}s{note})"
    if rc == 124:
        return None, f"timeout after {secs:.0f}s: {tail(log)}"
    return None, f"rc={rc}: {root_cause(log)}"


def finish_worker(rc: int) -> None:
    """End a worker process now, with its exit code, skipping interpreter teardown.

    The result file is already written; letting Python tear down a live vLLM engine is what aborts
    with rc -6 on the H200, and there is nothing left to clean up that the OS does not.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


def markdown_table(rows: list[dict], cols: list[str]) -> str:
    """rows of dicts -> a markdown table over cols (floats to 4 significant digits)."""

    def cell(v) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return "" if v is None else str(v).replace("|", "\\|")

    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(cell(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(out)
