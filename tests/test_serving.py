"""CPU tests of the serving benchmark driver's run plan (no vLLM engine is started)."""

from __future__ import annotations

import argparse
import json

import pytest

from benchmarks.serving import run_serving


def _bench(tmp_path, monkeypatch, calls):
    monkeypatch.setattr(run_serving, "gpu_name", lambda: "test")
    monkeypatch.delenv("VLLM_DEEP_GEMM_WARMUP", raising=False)
    args = argparse.Namespace(fp8block=tmp_path / "fp8", bf16=tmp_path / "bf16", out=tmp_path / "out",
                              quick=True, compile=False, gpu_mem=0.8, attention_backend="TRITON_ATTN",
                              budget_s=0, stage_cap_s=100, throughput_cases="prefill")
    bench = run_serving.Bench(args)

    def fake_run(name, cmd, cap, env=None):
        calls.append((name, dict(env or {})))
        out = cmd[cmd.index("--output-json") + 1]
        with open(out, "w") as f:
            json.dump({"elapsed_time": 2.0, "tokens_per_second": 10.0, "requests_per_second": 1.0}, f)
        return 0, 1.0, tmp_path / f"{name}.log"

    monkeypatch.setattr(bench, "run", fake_run)
    return bench


@pytest.mark.parametrize("variant, runs", [("vllm-fp8-block", 2), ("blockfp8", 1), ("bf16", 1)])
def test_throughput_warms_deepgemm_jit_untimed_and_skips_its_warmup(tmp_path, monkeypatch, variant, runs):
    calls = []
    bench = _bench(tmp_path, monkeypatch, calls)
    bench.throughput(variant)
    assert len(calls) == runs
    assert all(env.get("VLLM_DEEP_GEMM_WARMUP") == "skip" for _, env in calls)
    if runs == 2:
        assert calls[0][0].endswith("-jit-warmup") and not calls[1][0].endswith("-jit-warmup")
    [row] = bench.runs
    assert row["status"] == "ok" and row["tok_s"] == 10.0
    assert (row["jit_warmup_run"] is not None) == (runs == 2)


def test_throughput_keeps_an_explicit_deepgemm_warmup_and_then_runs_once(tmp_path, monkeypatch):
    calls = []
    bench = _bench(tmp_path, monkeypatch, calls)
    monkeypatch.setenv("VLLM_DEEP_GEMM_WARMUP", "full")
    bench.throughput("vllm-fp8-block")
    assert [env["VLLM_DEEP_GEMM_WARMUP"] for _, env in calls] == ["full"]
