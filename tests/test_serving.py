"""CPU tests of the serving benchmark driver's run plan (no vLLM engine is started)."""

from __future__ import annotations

import argparse
import json

import pytest

from benchmarks.serving import run_serving


def _bench(tmp_path, monkeypatch, calls, quick=True, cases="prefill"):
    monkeypatch.setattr(run_serving, "gpu_name", lambda: "test")
    monkeypatch.delenv("VLLM_DEEP_GEMM_WARMUP", raising=False)
    args = argparse.Namespace(fp8block=tmp_path / "fp8", bf16=tmp_path / "bf16", out=tmp_path / "out",
                              quick=quick, compile=False, gpu_mem=0.8, attention_backend="TRITON_ATTN",
                              budget_s=0, stage_cap_s=100, throughput_cases=cases)
    bench = run_serving.Bench(args)

    def fake_run(name, cmd, cap, env=None):
        calls.append((name, dict(env or {}), list(cmd)))
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
    assert all(env.get("VLLM_DEEP_GEMM_WARMUP") == "skip" for _, env, _ in calls)
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
    assert [env["VLLM_DEEP_GEMM_WARMUP"] for _, env, _ in calls] == ["full"]


def test_full_prefill_case_captures_few_graph_sizes_for_every_variant_and_mixed_keeps_defaults(
        tmp_path, monkeypatch):
    calls = []
    bench = _bench(tmp_path, monkeypatch, calls, quick=False, cases="prefill,mixed")
    for variant in ("blockfp8", "vllm-fp8-block", "bf16"):
        bench.throughput(variant)

    def graph_sizes(cmd):
        return json.loads(cmd[cmd.index("-cc") + 1])["cudagraph_capture_sizes"] if "-cc" in cmd else None

    sizes = {(name, tuple(graph_sizes(cmd) or ())) for name, _, cmd in calls}
    prefill = {s for name, s in sizes if "-prefill-" in name}
    mixed = {s for name, s in sizes if "-mixed-" in name}
    assert prefill == {tuple(run_serving.LATENCY_CC["cudagraph_capture_sizes"])}
    assert mixed == {()}
