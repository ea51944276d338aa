"""CPU tests of the serving benchmark driver's run plan (no vLLM engine is started)."""

from __future__ import annotations

import argparse
import json
import os
import time

import pytest

from benchmarks.serving import run_serving


def _bench(tmp_path, monkeypatch, calls, quick=True, cases="prefill", profile_cases="prefill,decode",
           profile_prompts=0):
    monkeypatch.setattr(run_serving, "gpu_name", lambda: "test")
    monkeypatch.delenv("VLLM_DEEP_GEMM_WARMUP", raising=False)
    args = argparse.Namespace(fp8block=tmp_path / "fp8", bf16=tmp_path / "bf16", out=tmp_path / "out",
                              quick=quick, compile=False, gpu_mem=0.8, attention_backend="TRITON_ATTN",
                              budget_s=0, stage_cap_s=100, throughput_cases=cases,
                              profile_cases=profile_cases, profile_prompts=profile_prompts)
    bench = run_serving.Bench(args)

    def fake_run(name, cmd, cap, env=None):
        calls.append((name, dict(env or {}), list(cmd)))
        out = cmd[cmd.index("--output-json") + 1]
        with open(out, "w") as f:
            json.dump({"elapsed_time": 2.0, "tokens_per_second": 10.0, "requests_per_second": 1.0}, f)
        return 0, 1.0, tmp_path / f"{name}.log"

    monkeypatch.setattr(bench, "run", fake_run)
    return bench


@pytest.mark.parametrize("variant", ["vllm-fp8-block", "blockfp8", "bf16"])
def test_throughput_warms_every_variant_untimed_first(tmp_path, monkeypatch, variant):
    """Every variant JIT-compiles something on first use (DeepGEMM, Triton attention): one
    identical untimed run first, then the timed one, with DeepGEMM's own warmup skipped."""
    calls = []
    bench = _bench(tmp_path, monkeypatch, calls)
    bench.throughput(variant)
    assert [name.endswith("-jit-warmup") for name, _, _ in calls] == [True, False]
    assert calls[0][2] == calls[1][2], "the warm-up must run exactly the timed command"
    assert all(env.get("VLLM_DEEP_GEMM_WARMUP") == "skip" for _, env, _ in calls)
    [row] = bench.runs
    assert row["status"] == "ok" and row["tok_s"] == 10.0
    assert row["jit_warmup_run"] == {"rc": 0, "seconds": 1.0}


def test_throughput_keeps_an_explicit_deepgemm_warmup(tmp_path, monkeypatch):
    calls = []
    bench = _bench(tmp_path, monkeypatch, calls)
    monkeypatch.setenv("VLLM_DEEP_GEMM_WARMUP", "full")
    bench.throughput("vllm-fp8-block")
    assert [env["VLLM_DEEP_GEMM_WARMUP"] for _, env, _ in calls] == ["full", "full"]


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


def _write_trace(path, kernels):
    import gzip

    events = [{"ph": "X", "cat": "kernel", "name": n, "dur": d, "ts": i} for i, (n, d) in enumerate(kernels)]
    events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "dur": 1e6, "ts": 0})  # host: ignored
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)


def test_kernel_profile_sums_gpu_kernels_by_category_per_token_per_layer(tmp_path):
    from benchmarks.serving import kernel_profile as kp

    _write_trace(tmp_path / "rank0.pt.trace.json.gz", [
        ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<X>>(Params)", 300.0),
        ("void blockfp8::quant::(anonymous namespace)::per_token_group_kernel<__nv_bfloat16>(...)", 40.0),
        ("void vllm::rms_norm_per_block_quant_kernel<c10::BFloat16>(...)", 20.0),
        ("void deep_gemm::sm90_fp8_gemm_1d2d_impl<(cute::UMMA::Major)0, 128>(cutlass::bfloat16_t*, ...)", 200.0),
        ("kernel_unified_attention_2d", 100.0),
        ("triton_red_fused_add_mean_mul_pow_rsqrt_0", 30.0),
        ("void blockfp8::gemv::mma_kernel<16, 1, 2, __nv_bfloat16>(Args)", 10.0),
    ])
    s = kp.summarize(tmp_path, tokens=10, layers=2)
    cats = {r["category"]: r for r in s["categories"]}
    assert s["kernel_us"] == 700.0 and s["unit"] == "us per token per layer"
    assert cats["gemm: CUTLASS (blockfp8 W8A8)"]["us"] == 300.0
    assert cats["gemm: DeepGEMM"]["us"] == 200.0
    assert cats["quant: activation"]["us"] == 40.0
    assert cats["norm+quant (fused)"]["us"] == 20.0
    assert cats["gemv: blockfp8"]["us"] == 10.0
    assert cats["attention"]["per"] == 100.0 / 20
    assert cats["other"]["us"] == 30.0
    assert [k["us"] for k in s["top_kernels"]] == sorted((k["us"] for k in s["top_kernels"]), reverse=True)
    assert "| gemm: DeepGEMM | 200 |" in kp.markdown(s)


def test_kernel_profile_reports_gpu_idle_stalls_with_the_cpu_op_behind_them(tmp_path):
    """Wall time beside kernel time: a GPU gap longer than the threshold is a stall, named after
    the longest CPU op running through it (a JIT compile inside attention, on the H200)."""
    from benchmarks.serving import kernel_profile as kp

    ms = 1000.0
    events = [
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 0.0, "dur": 10 * ms},
        {"ph": "X", "cat": "kernel", "name": "norm", "ts": 5 * ms, "dur": 10 * ms},  # overlaps: busy once
        {"ph": "X", "cat": "kernel", "name": "attn", "ts": 20 * ms, "dur": 5 * ms},  # 5 ms gap: not a stall
        {"ph": "X", "cat": "kernel", "name": "attn", "ts": 700 * ms, "dur": 5 * ms},  # 675 ms gap: a stall
        {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "ts": 30 * ms, "dur": 1 * ms},
        {"ph": "X", "cat": "cpu_op", "name": "vllm::unified_attention_with_output", "ts": 26 * ms,
         "dur": 670 * ms},
    ]
    t = kp.timeline(events, stall_us=100 * ms)
    assert t["span_us"] == 705 * ms and t["busy_us"] == 25 * ms and t["idle_us"] == 680 * ms
    assert t["stalls"] == [{"us": 675 * ms, "at_us": 25 * ms, "cpu_op": "vllm::unified_attention_with_output"}]
    # The gaps by length and by the kernels around them: the norm kernel ends last before the
    # first gap, so the gap after gemm+norm is charged to norm -> attention.
    assert [(b["gaps"], b["idle_us"]) for b in t["gap_buckets"] if b["gaps"]] == [(1, 5 * ms), (1, 675 * ms)]
    assert t["gap_pairs"] == [{"before": "attention", "after": "attention", "idle_us": 675 * ms, "gaps": 1},
                              {"before": "norm", "after": "attention", "idle_us": 5 * ms, "gaps": 1}]
    path = tmp_path / "t" / "rank0.pt.trace.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"traceEvents": events}))
    s = kp.summarize(path.parent, stall_ms=100)
    assert s["timelines"][0]["stalls"][0]["cpu_op"] == "vllm::unified_attention_with_output"
    assert "675: vllm::unified_attention_with_output" in kp.markdown(s)
    assert "| norm -> attention | 1 | 5.0 |" in kp.markdown(s)


def test_profile_stage_runs_prefill_and_decode_under_the_torch_profiler_and_records_the_breakdown(
        tmp_path, monkeypatch):
    from benchmarks.serving import report_serving

    calls = []
    bench = _bench(tmp_path, monkeypatch, calls, quick=False)
    (tmp_path / "fp8").mkdir()
    (tmp_path / "fp8" / "config.json").write_text(json.dumps({"num_hidden_layers": 4}))

    def fake_run(name, cmd, cap, env=None):
        calls.append((name, dict(env or {}), list(cmd)))
        trace_dir = json.loads(cmd[cmd.index("--profiler-config") + 1])["torch_profiler_dir"]
        _write_trace(run_serving.Path(trace_dir) / "w0.json.gz", [("deep_gemm_x", 64.0), ("nvjet_y", 32.0)])
        return 0, 1.0, tmp_path / f"{name}.log"

    monkeypatch.setattr(bench, "run", fake_run)
    bench.profile("vllm-fp8-block")
    assert [c[0] for c in calls] == ["profile-prefill-vllm-fp8-block", "profile-decode-vllm-fp8-block"]
    dirs = set()
    for name, env, cmd in calls:
        assert "--profile" in cmd and env["VLLM_DEEP_GEMM_WARMUP"] == "skip"
        cfg = json.loads(cmd[cmd.index("--profiler-config") + 1])
        assert cfg["profiler"] == "torch" and run_serving.Path(cfg["torch_profiler_dir"]).is_absolute()
        dirs.add(cfg["torch_profiler_dir"])
    assert len(dirs) == 2, "each case needs its own trace directory"
    prefill_cmd, decode_cmd = calls[0][2], calls[1][2]
    assert "throughput" in prefill_cmd and "latency" in decode_cmd
    assert decode_cmd[decode_cmd.index("--input-len") + 1] == "8"
    assert decode_cmd[decode_cmd.index("--output-len") + 1] == str(run_serving.DECODE_TOKENS)
    prefill, decode = bench.runs
    tokens = run_serving.FULL["profile_prompts"] * run_serving.FULL["prefill"][0]
    assert prefill["status"] == "ok" and prefill["layers"] == 4 and prefill["tokens"] == tokens
    assert prefill["categories"]["gemm: DeepGEMM"] == 64.0 / (tokens * 4)
    assert decode["tokens"] == run_serving.DECODE_TOKENS
    assert decode["categories"]["gemm: cuBLAS"] == 32.0 / (run_serving.DECODE_TOKENS * 4)
    table = "\n".join(report_serving.tables(bench.runs).values())
    assert "gemm: DeepGEMM" in table and "decode" in table


def test_profile_prompts_sets_the_profiled_prefill_size(tmp_path, monkeypatch):
    """--profile-prompts profiles a longer prefill run (e.g. the throughput case's 512 prompts,
    to see GPU idle time that a 48-prompt window misses); the tokens per layer follow it."""
    calls = []
    bench = _bench(tmp_path, monkeypatch, calls, quick=False, profile_cases="prefill", profile_prompts=512)
    monkeypatch.setattr(bench, "run", lambda name, cmd, cap, env=None: (calls.append(cmd), (0, 1.0, tmp_path / "x.log"))[1])
    bench.profile("blockfp8")
    [cmd] = calls
    assert cmd[cmd.index("--num-prompts") + 1] == "512"
    assert bench.runs[0]["tokens"] == 512 * run_serving.FULL["prefill"][0]


def test_profile_stage_without_a_trace_fails_the_row(tmp_path, monkeypatch):
    calls = []
    bench = _bench(tmp_path, monkeypatch, calls, quick=False, profile_cases="prefill")
    monkeypatch.setattr(bench, "run", lambda name, cmd, cap, env=None: (0, 1.0, tmp_path / "x.log"))
    bench.profile("blockfp8")
    [row] = bench.runs
    assert row["status"] == "failed" and "no trace" in row["note"]


def test_clock_summary_keeps_busy_samples_and_counts_the_power_cap(tmp_path):
    """Idle samples, headers and N/A rows are left out; the median SM clock and power of the busy
    ones and the share at the 700 W cap are what tell two engines' clocks apart."""
    from benchmarks.serving import run_serving

    path = tmp_path / "x.clock.csv"
    path.write_text("1, 345, 80.5\n1, 1980, 450.0\n1, 1620, 695.2\n1, 1500, 699.9\n1, [N/A], [N/A]\n1, 19")
    s = run_serving.clock_summary(path)
    assert s == {"samples": 6, "busy": 3, "sm_mhz_median": 1620.0, "sm_mhz_min": 1500.0,
                 "power_w_median": 695.2, "at_cap_share": 2 / 3}
    assert run_serving.clock_summary(tmp_path / "missing.csv") is None
    path.write_text("0, 345, 70.0\n")
    assert run_serving.clock_summary(path) == {"samples": 1, "busy": 0}


def test_every_run_samples_the_visible_gpus_clock_and_stops_the_sampler(tmp_path, monkeypatch):
    """Bench.run starts nvidia-smi on CUDA_VISIBLE_DEVICES beside the command and stops it after;
    record() adds the summary. A fake nvidia-smi on PATH logs its arguments and prints samples."""
    import stat

    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/smi_args\n'
                    'while true; do echo "1, 1650, 690.0"; sleep 0.05; done\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.setattr(run_serving, "gpu_name", lambda: "test")
    args = argparse.Namespace(fp8block=tmp_path / "fp8", bf16=tmp_path / "bf16", out=tmp_path / "out",
                              quick=True, compile=False, gpu_mem=0.8, attention_backend="TRITON_ATTN",
                              budget_s=0, stage_cap_s=100, throughput_cases="prefill",
                              profile_cases="prefill", profile_prompts=0)
    bench = run_serving.Bench(args)
    rc, _, log = bench.run("t", ["sleep", "0.5"], 30)
    assert rc == 0
    assert "-i 1" in (tmp_path / "smi_args").read_text()
    row = bench.record(stage="throughput", variant="blockfp8", case="prefill", rc=rc, log=log)
    assert row["gpu_clock"]["busy"] >= 3 and row["gpu_clock"]["sm_mhz_median"] == 1650.0
    assert row["gpu_clock"]["at_cap_share"] == 1.0
    n = len(run_serving.clock_log(log).read_text().splitlines())
    time.sleep(0.3)
    assert len(run_serving.clock_log(log).read_text().splitlines()) == n, "the sampler must be stopped"
