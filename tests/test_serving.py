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
    args = argparse.Namespace(fp8block=tmp_path / "fp8", bf16=tmp_path / "bf16", nvfp4=tmp_path / "nvfp4",
                              out=tmp_path / "out", quick=quick, compile=False, gpu_mem=0.8,
                              attention_backend="TRITON_ATTN", budget_s=0, stage_cap_s=100,
                              throughput_cases=cases, profile_cases=profile_cases,
                              profile_prompts=profile_prompts)
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


def _write_result(cmd, tok_s):
    with open(cmd[cmd.index("--output-json") + 1], "w") as f:
        json.dump({"elapsed_time": 2.0, "tokens_per_second": tok_s, "requests_per_second": 1.0}, f)


def test_throughput_keeps_a_result_written_before_the_cap_struck_at_shutdown(tmp_path, monkeypatch):
    """vllm bench writes its JSON, then the engine shuts down: a cap that strikes during the shutdown
    must not throw the finished measurement away (it did, as a "timeout")."""
    bench = _bench(tmp_path, monkeypatch, [])

    def run(name, cmd, cap, env=None):
        _write_result(cmd, 5.0 if name.endswith("-jit-warmup") else 7.0)
        return (0 if name.endswith("-jit-warmup") else 124), 1.0, tmp_path / f"{name}.log"

    monkeypatch.setattr(bench, "run", run)
    bench.throughput("blockfp8")
    [row] = bench.runs
    assert row["status"] == "ok" and row["tok_s"] == 7.0 and "shutdown" in row["note"]


@pytest.mark.parametrize("timed_rc", [0, 124])
def test_throughput_never_reports_the_warmups_result(tmp_path, monkeypatch, timed_rc):
    """The warm-up writes the same file: a timed run that wrote nothing (killed, or exited 0 without
    a result) fails instead of reporting the warm-up's number."""
    bench = _bench(tmp_path, monkeypatch, [])

    def run(name, cmd, cap, env=None):
        if name.endswith("-jit-warmup"):
            _write_result(cmd, 5.0)
        return (0 if name.endswith("-jit-warmup") else timed_rc), 1.0, tmp_path / f"{name}.log"

    monkeypatch.setattr(bench, "run", run)
    bench.throughput("blockfp8")
    [row] = bench.runs
    assert row["status"] == ("timeout" if timed_rc == 124 else "failed") and "tok_s" not in row


def test_latency_counts_a_result_cut_short_mid_write_as_failed(tmp_path, monkeypatch):
    bench = _bench(tmp_path, monkeypatch, [])
    (tmp_path / "out").mkdir(parents=True, exist_ok=True)

    def run(name, cmd, cap, env=None):
        with open(cmd[cmd.index("--output-json") + 1], "w") as f:
            f.write('{"avg_latency": 0.')
        return 124, 1.0, tmp_path / f"{name}.log"

    monkeypatch.setattr(bench, "run", run)
    bench.latency("blockfp8")
    [row] = bench.runs
    assert row["status"] == "timeout" and "decode_tok_s" not in row


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


_MARLIN_ARGS = ("(int4 const*, int4 const*, int4*, int4*, int4 const*, float const*, int4 const*, float const*, "
                "int4 const*, int const*, int, int, int, int, int, int*, bool, bool, bool, int)")


def test_kernel_profile_files_nvfp4_kernels_apart_from_fp8_and_other(tmp_path):
    """Our NVFP4 GEMMs (w4a16_kernel, the SM90 w4a16_wgmma_kernel, their split-K reduce) and GEMVs, and vLLM's
    Marlin on an NVFP4 weight (e2m1 codes, e4m3 scales), each in an NVFP4 category of its own: not "other" (Marlin,
    w4a16_kernel) and not the FP8 GEMV's (w4a16_wgmma_kernel holds "mma_kernel"). Marlin on another weight type
    (MXFP4: e8m0 scales) is Marlin but not NVFP4; the FP8 kernels keep their categories."""
    from benchmarks.serving import kernel_profile as kp

    bf16, e2m1, e4m3, e8m0 = 1125899906909960, 562949953487106, 2814749767172868, 2814749767106568
    kernels = {
        "void blockfp8::fp4::w4a16_kernel<4, 2, 4, 4, true, __nv_bfloat16>(blockfp8::fp4::Args<__nv_bfloat16>, "
        "float*)": ("nvfp4 gemm: blockfp8", 100.0),
        "void blockfp8::fp4::sm90::w4a16_wgmma_kernel<1, __nv_bfloat16>(blockfp8::fp4::Args<__nv_bfloat16>, "
        "float*)": ("nvfp4 gemm: blockfp8", 200.0),
        "void blockfp8::fp4::w4a16_reduce_kernel<__nv_bfloat16>(blockfp8::fp4::Args<__nv_bfloat16>, float const*, "
        "int)": ("nvfp4 gemm: blockfp8", 10.0),
        "void blockfp8::fp4::gemv_mma_kernel<16, 1, 2, 1, 3, 1, true, __nv_bfloat16>("
        "blockfp8::fp4::Args<__nv_bfloat16>)": ("nvfp4 gemv: blockfp8", 40.0),
        "void blockfp8::fp4::gemv_fma_kernel<4, true, __nv_bfloat16>(blockfp8::fp4::Args<__nv_bfloat16>)":
            ("nvfp4 gemv: blockfp8", 2.0),
        f"void marlin::Marlin<{bf16}l, {e2m1}l, {bf16}l, {e4m3}l, 256, 1, 8, 8, false, 4, 1, false>{_MARLIN_ARGS}":
            ("nvfp4: marlin", 300.0),
        f"void marlin::Marlin<{bf16}l, {e2m1}l, {bf16}l, {e4m3}l, 128, 4, 8, 4, false, 4, 1, false>{_MARLIN_ARGS}":
            ("nvfp4: marlin", 50.0),
        f"void marlin::Marlin<{bf16}l, {e2m1}l, {bf16}l, {e8m0}l, 256, 1, 8, 8, false, 4, 2, false>{_MARLIN_ARGS}":
            ("gemm: Marlin (other weight types)", 7.0),
        "void blockfp8::gemv::mma_kernel<16, 1, 2, __nv_bfloat16>(Args)": ("gemv: blockfp8", 20.0),
        "void blockfp8::fp4::native::(anonymous namespace)::quantize_kernel(blockfp8::fp4::native::QuantProblem)":
            ("quant: activation", 3.0),
        "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<X>>(Params)":
            ("gemm: CUTLASS (blockfp8 W8A8)", 30.0),
        "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cute::tuple<cutlass::nv_float4_t<"
        "cutlass::float_e2m1_t>>>>(Params)": ("nvfp4 gemm: CUTLASS W4A4 (e2m1)", 5.0),
    }
    assert {n: kp.category(n) for n in kernels} == {n: c for n, (c, _) in kernels.items()}
    _write_trace(tmp_path / "rank0.pt.trace.json.gz", [(n, us) for n, (_, us) in kernels.items()])
    cats = {r["category"]: r["us"] for r in kp.summarize(tmp_path)["categories"]}
    assert cats["nvfp4 gemm: blockfp8"] == 310.0 and cats["nvfp4 gemv: blockfp8"] == 42.0
    assert cats["nvfp4: marlin"] == 350.0 and cats["gemv: blockfp8"] == 20.0 and "other" not in cats


def test_kernel_profile_marlin_ids_are_the_installed_vllms():
    """The ScalarType ids the NVFP4 Marlin pattern keys on are vLLM's, and the installed vLLM's binaries hold Marlin
    instantiations on them (bf16 and fp16 activations) that the pattern files as "nvfp4: marlin" once demangled."""
    import mmap
    import re
    import shutil
    import subprocess

    from benchmarks.serving import kernel_profile as kp

    scalar_type = pytest.importorskip("vllm.scalar_type")
    ids = {n: getattr(scalar_type.scalar_types, n).id for n in kp.SCALAR_TYPE_ID}
    assert ids == kp.SCALAR_TYPE_ID
    root = run_serving.Path(scalar_type.__file__).parent
    pattern = rb"_ZN6marlin6MarlinILl\d+ELl%dELl\d+ELl%dE[0-9A-Za-z_]+" % (ids["float4_e2m1f"], ids["float8_e4m3fn"])
    found = set()
    for lib in root.glob("_C*.so"):
        with open(lib, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            found.update(x.decode() for x in re.findall(pattern, m))
    if not found:
        pytest.skip("no NVFP4 Marlin kernels in the installed vLLM's _C libraries")
    if shutil.which("c++filt") is None:
        pytest.skip("no c++filt to demangle with")
    names = subprocess.run(["c++filt"], input="\n".join(sorted(found)), capture_output=True, text=True,
                           check=True).stdout.split("\n")
    names = [n for n in names if n.startswith("void marlin::Marlin<")]  # not the host stubs' statics
    assert names, sorted(found)[:2]
    assert {kp.category(n) for n in names} == {"nvfp4: marlin"}, names[:2]


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


# ---- NVFP4 variants -----------------------------------------------------------------------------


@pytest.mark.parametrize("variant,ckpt,quant", [("blockfp8-nvfp4", "nvfp4", "blockfp8"), ("vllm-nvfp4", "nvfp4", None),
                                                ("blockfp8", "fp8", "blockfp8"), ("vllm-fp8-block", "fp8", None)])
def test_nvfp4_variants_serve_the_nvfp4_checkpoint_with_the_right_quantization_flag(tmp_path, monkeypatch, variant,
                                                                                    ckpt, quant):
    """blockfp8-nvfp4: --quantization blockfp8 on nvfp4/; vllm-nvfp4: no flag (vLLM resolves modelopt_fp4 from the
    config); a quantized checkpoint is never dummy-loaded, so no --load-format even without weights; every other
    engine argument is the same for every variant."""
    bench = _bench(tmp_path, monkeypatch, [], quick=False)
    model, args = bench.engine_args(variant)
    assert model == str(tmp_path / ckpt)
    assert (args[args.index("--quantization") + 1] if "--quantization" in args else None) == quant
    assert "--load-format" not in args
    _, base = bench.engine_args("bf16")  # bf16 without weights: dummy
    assert base[base.index("--load-format") + 1] == "dummy"
    common = [x for x in base if x not in ("--load-format", "dummy")]
    assert [x for x in args if x not in ("--quantization", "blockfp8")] == common


def test_nvfp4_aliases_and_checkpoint_refusal(tmp_path, monkeypatch, capsys):
    """The aliases resolve; an NVFP4 variant whose checkpoint has no weights stops the run at parse time (a dummy
    fill would time zeros), naming the maker; --nvfp4 defaults to nvfp4/ beside --fp8block."""
    assert run_serving.ALIASES["nvfp4"] == "blockfp8-nvfp4" and run_serving.ALIASES["marlin-fp4"] == "vllm-nvfp4"
    assert run_serving.PEERS["blockfp8-nvfp4"] == "vllm-nvfp4"
    (tmp_path / "m" / "fp8block").mkdir(parents=True)
    (tmp_path / "m" / "fp8block" / "model-00001.safetensors").write_bytes(b"")
    argv = ["run_serving.py", "--fp8block", str(tmp_path / "m" / "fp8block"), "--bf16", str(tmp_path / "m" / "bf16"),
            "--out", str(tmp_path / "out"), "--stages", "latency"]
    monkeypatch.setattr("sys.argv", argv + ["--variants", "nvfp4,blockfp8"])
    with pytest.raises(SystemExit) as e:
        run_serving.main()
    err = capsys.readouterr().err
    assert e.value.code == 2 and "blockfp8-nvfp4 need --nvfp4 with weights" in err
    assert str(tmp_path / "m" / "nvfp4") in err and "make_qwen3_8b.py --nvfp4" in err
    monkeypatch.setattr("sys.argv", argv + ["--variants", "marlin-fp4", "--throughput-cases", "bogus"])
    with pytest.raises(SystemExit):
        run_serving.main()
    assert "bogus" in capsys.readouterr().err


def test_batch32_case_is_a_batch_32_latency_run_with_graphs_up_to_32(tmp_path, monkeypatch):
    """The 32 x (128 in, 128 out) batch lasts ~1 s: it runs as `bench latency --batch-size 32` (warm-up and timed
    iterations in one engine, no separate warm-up engine), and its rates come from the average iteration."""
    calls = []
    bench = _bench(tmp_path, monkeypatch, calls, quick=False, cases="batch32")

    def fake_run(name, cmd, cap, env=None):
        calls.append((name, dict(env or {}), list(cmd)))
        with open(cmd[cmd.index("--output-json") + 1], "w") as f:
            json.dump({"avg_latency": 2.0, "percentiles": {"50": 1.9}}, f)
        return 0, 1.0, tmp_path / f"{name}.log"

    monkeypatch.setattr(bench, "run", fake_run)
    bench.throughput("blockfp8-nvfp4")
    [(name, _, cmd)] = calls
    assert name == "throughput-batch32-blockfp8-nvfp4" and cmd[cmd.index("bench") + 1] == "latency"
    assert [cmd[cmd.index(f) + 1] for f in ("--batch-size", "--input-len", "--output-len")] == ["32", "128", "128"]
    assert [cmd[cmd.index(f) + 1] for f in ("--num-iters-warmup", "--num-iters")] == ["3", "10"]
    assert json.loads(cmd[cmd.index("-cc") + 1]) == {"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32]}
    [row] = bench.runs
    assert row["case"] == "batch32" and row["status"] == "ok" and row["output_tok_s"] == 32 * 128 / 2.0
    assert row["tok_s"] == 32 * 256 / 2.0 and row["p50_latency_s"] == 1.9


def test_kernel_lines_name_vllms_nvfp4_kernel_choice(tmp_path):
    """The log lines vLLM 0.26 prints when it picks its NVFP4 linear kernel (texts read from the installed vLLM, so a
    reworded message fails here) and this plugin's, but not the engine's argument dump."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    root = run_serving.Path(spec.origin).parent / "model_executor" / "kernels" / "linear"
    select, marlin = (root / "__init__.py").read_text(), (root / "nvfp4" / "marlin.py").read_text()
    assert '"Using %s for NVFP4 GEMM"' in select and "class MarlinNvFp4LinearKernel" in marlin
    warning = ("Your GPU does not have native support for FP4 computation but FP4 quantization is being used. "
               "Weight-only FP4 compression will be used leveraging the Marlin kernel.")
    assert all(part in marlin for part in ('"Your GPU does not have native support for FP4 computation but "',
                                           '"will be used leveraging the Marlin kernel.'))
    log = tmp_path / "x.log"
    log.write_text("\n".join([
        "INFO 12-03 10:00:00 [utils.py:1] non-default args: {'model': '/tmp/q3-36L/nvfp4', 'quantization': None}",
        "INFO 12-03 10:00:05 [__init__.py:978] Using MarlinNvFp4LinearKernel for NVFP4 GEMM",
        f"WARNING 12-03 10:00:09 [marlin.py:34] {warning} This may degrade performance for compute-heavy workloads.",
        "INFO 12-03 10:00:09 [linear.py:181] blockfp8: NVFP4 runs weight-only (W4A16): SM90",
        "INFO 12-03 10:00:10 [gpu_model_runner.py:1] Model loading took 6.1 GiB"]))
    lines = run_serving.kernel_lines(log)
    assert len(lines) == 3 and "Using MarlinNvFp4LinearKernel for NVFP4 GEMM" in lines[0]
    assert "leveraging the Marlin kernel" in lines[1] and "blockfp8: NVFP4 runs" in lines[2]


def test_peer_ratios_put_each_of_ours_beside_vllms_path_on_the_same_checkpoint(tmp_path):
    runs = [dict(stage="latency", case="b1", variant="blockfp8-nvfp4", status="ok", decode_tok_s=150.0),
            dict(stage="latency", case="b1", variant="vllm-nvfp4", status="ok", decode_tok_s=100.0),
            dict(stage="latency", case="b1", variant="blockfp8", status="ok", decode_tok_s=130.0),
            dict(stage="throughput", case="prefill", variant="blockfp8-nvfp4", status="ok", tok_s=30.0),
            dict(stage="throughput", case="prefill", variant="vllm-nvfp4", status="failed"),
            dict(stage="profile", case="decode", variant="blockfp8-nvfp4", status="ok", kernel_us=5.0)]
    assert run_serving.peer_ratios(runs) == [
        "latency b1: blockfp8-nvfp4 / vllm-nvfp4 = 1.500x (decode_tok_s 150 vs 100)"]
    (tmp_path / "results.md").write_text("## tables\n")
    run_serving.write_peer_ratios(tmp_path, runs)
    assert "blockfp8-nvfp4 / vllm-nvfp4 = 1.500x" in (tmp_path / "results.md").read_text()


# ---- make_qwen3_8b.py --nvfp4 -------------------------------------------------------------------

TINY_SHAPE = {"hidden": 256, "intermediate": 512, "heads": 2, "kv_heads": 1, "head_dim": 64, "vocab": 1024}


@pytest.fixture(scope="module")
def tiny_q3(tmp_path_factory):
    """make_qwen3_8b.py --nvfp4 --bf16-weights on a 2-layer tiny shape, on the CPU (a 512-token tokenizer trained
    here)."""
    pytest.importorskip("transformers")
    from benchmarks.serving import make_qwen3_8b

    out = tmp_path_factory.mktemp("q3") / "q3"
    argv = [str(out), "--layers", "2", "--device", "cpu", "--nvfp4", "--bf16-weights", "--tokenizer-vocab", "512",
            "--shape", json.dumps(TINY_SHAPE)]
    assert make_qwen3_8b.main(argv) == 0
    return out


def _tensors(path):
    from safetensors import safe_open

    out = {}
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as h:
            out.update({k: h.get_tensor(k) for k in h.keys()})
    return out


def _same_bits(a, b) -> bool:
    """Bit equality (fp8 compared as bytes: torch.equal has no float8 kernel on some builds)."""
    import torch

    def bits(t):
        return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t

    return a.dtype == b.dtype and torch.equal(bits(a), bits(b))


def test_make_qwen3_nvfp4_writes_a_modelopt_checkpoint_of_the_bf16_weights(tiny_q3):
    import torch

    from vllm_blockfp8 import reference as ref

    manifest = json.loads((tiny_q3 / "manifest.json").read_text())
    assert manifest["bf16_load_format"] == "safetensors"
    nv = manifest["nvfp4"]
    assert nv["quantized_weights"] == 2 * 7 and nv["not_quantized"] == ["lm_head", "model.embed_tokens"]
    assert manifest["bytes"]["nvfp4"] == nv["bytes"] > 0 and nv["seconds"] >= 0
    cfg = json.loads((tiny_q3 / "nvfp4" / "config.json").read_text())
    qcfg = cfg["quantization_config"]
    assert (qcfg["quant_method"], qcfg["quant_algo"], qcfg["group_size"]) == ("modelopt", "NVFP4", 16)
    assert qcfg["ignore"] == qcfg["exclude_modules"] == ["lm_head", "model.embed_tokens"]
    assert json.loads((tiny_q3 / "nvfp4" / "hf_quant_config.json").read_text())["quantization"]["quant_algo"] == "NVFP4"
    bf16_cfg = json.loads((tiny_q3 / "bf16" / "config.json").read_text())
    assert {k: v for k, v in cfg.items() if k != "quantization_config"} == bf16_cfg
    assert (tiny_q3 / "nvfp4" / "tokenizer.json").read_text() == (tiny_q3 / "bf16" / "tokenizer.json").read_text()

    bf16, fp8, fp4 = (_tensors(tiny_q3 / d) for d in ("bf16", "fp8block", "nvfp4"))
    for name, t in bf16.items():
        if name.startswith("model.layers.") and name.endswith("_proj.weight"):
            m = name[: -len(".weight")]
            assert fp4[name].dtype == torch.uint8 and fp4[name].shape == (t.shape[0], t.shape[1] // 2)
            assert fp4[f"{m}.weight_scale"].dtype == torch.float8_e4m3fn
            deq = ref.dequantize_nvfp4(fp4[name], fp4[f"{m}.weight_scale"], fp4[f"{m}.weight_scale_2"])
            rel = float((deq - t.float()).norm() / t.float().norm())
            assert rel < 0.15, (name, rel)  # NVFP4's rounding of the same weights (~0.095 on N(0, std))
            # bf16/ holds the FP8 weights dequantized: the same effective weights as fp8block/
            assert torch.equal(ref.dequantize_block_fp8(fp8[name], fp8[f"{m}.weight_scale_inv"]).to(torch.bfloat16), t)
        else:  # embeddings, norms, lm_head: bf16, bit for bit
            assert fp4[name].dtype == torch.bfloat16 and torch.equal(fp4[name], t), name
    for layer in range(2):  # vLLM fuses q/k/v and gate/up with one global scale each
        pre = f"model.layers.{layer}."
        for group in (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), ("mlp.gate_proj", "mlp.up_proj")):
            scales = {float(fp4[f"{pre}{m}.weight_scale_2"]) for m in group}
            assert len(scales) == 1, (pre, group, scales)


def test_make_qwen3_nvfp4_is_what_the_quantizer_writes_from_the_bf16_checkpoint(tiny_q3, tmp_path):
    """nvfp4/, quantized in make_qwen3_8b's pass, against ``quantize_checkpoint(bf16/, fmt="nvfp4")`` (what ``python -m
    vllm_blockfp8 quantize --format nvfp4`` runs) on the bf16 checkpoint of the same pass: the same tensor names,
    dtypes, shapes and bytes (codes, block scales, global scales, input scales, bf16 embeddings / norms / lm_head),
    the same config.json and hf_quant_config.json text, the same side files, and the same report rows."""
    from vllm_blockfp8.tools.quantize import quantize_checkpoint

    ref_dir = tmp_path / "nvfp4-ref"
    report = quantize_checkpoint(tiny_q3 / "bf16", ref_dir, fmt="nvfp4", progress=False)
    ours, theirs = _tensors(tiny_q3 / "nvfp4"), _tensors(ref_dir)
    assert sorted(ours) == sorted(theirs)
    for name, t in theirs.items():
        assert (ours[name].dtype, ours[name].shape) == (t.dtype, t.shape), name
        assert _same_bits(ours[name], t), name
    for f in ("config.json", "hf_quant_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (tiny_q3 / "nvfp4" / f).read_text() == (ref_dir / f).read_text(), f
    assert {p.name for p in (tiny_q3 / "nvfp4").iterdir() if not p.name.endswith(".safetensors")} == \
        {p.name for p in ref_dir.iterdir() if not p.name.endswith(".safetensors")}
    index = json.loads((tiny_q3 / "nvfp4" / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == json.loads((ref_dir / "model.safetensors.index.json").read_text()
                                                        )["metadata"]["total_size"]
    mine = json.loads((tiny_q3 / "nvfp4" / "quantization_report.json").read_text())
    for key in ("format", "copied_files", "not_quantized", "warnings", "nvfp4_input_scale"):
        assert mine[key] == report[key], key
    rows = {r["name"]: r for r in report["layers"]}
    assert sorted(r["name"] for r in mine["layers"]) == sorted(rows)
    for r in mine["layers"]:
        assert r["shape"] == rows[r["name"]]["shape"]
        assert r["rms_rel"] == pytest.approx(rows[r["name"]]["rms_rel"], rel=1e-9)
        assert r["max_rel"] == pytest.approx(rows[r["name"]]["max_rel"], rel=1e-9)


def test_make_qwen3_nvfp4_needs_no_bf16_weights(tiny_q3, tmp_path):
    """--nvfp4 alone: no bf16 weights on disk (bf16/ is config + tokenizer, served with --load-format dummy), and
    the same fp8block/ and nvfp4/ bytes as with --bf16-weights (the same draws; NVFP4 from the same bf16 values)."""
    from benchmarks.serving import make_qwen3_8b

    out = tmp_path / "q3"
    assert make_qwen3_8b.main([str(out), "--layers", "2", "--device", "cpu", "--nvfp4", "--tokenizer-from",
                               str(tiny_q3 / "bf16"), "--shape", json.dumps(TINY_SHAPE)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["bf16_load_format"] == "dummy" and not list((out / "bf16").glob("*.safetensors"))
    assert manifest["nvfp4"]["quantized_weights"] == 14 and (out / "nvfp4" / "config.json").is_file()
    for d in ("fp8block", "nvfp4"):
        a, b = _tensors(out / d), _tensors(tiny_q3 / d)
        assert sorted(a) == sorted(b) and all(_same_bits(a[k], b[k]) for k in a), d
    # Without --nvfp4 a rerun removes the stale nvfp4/ (other weights, maybe) and records none.
    assert make_qwen3_8b.main([str(out), "--layers", "1", "--device", "cpu", "--tokenizer-from",
                               str(tiny_q3 / "bf16"), "--shape", json.dumps(TINY_SHAPE)]) == 0
    assert not (out / "nvfp4").exists() and json.loads((out / "manifest.json").read_text())["nvfp4"] is None


def test_make_qwen3_nvfp4_quantize_runs_the_tools_function_on_the_weights_device():
    """nvfp4_quantize runs tools/quantize.py's _nvfp4_chunk on the weight's own device (the GPU in the real pass):
    checked on the meta device, where the tool's function alone fails (its extra amax row is made on the CPU)."""
    import torch

    from benchmarks.serving import make_qwen3_8b
    from vllm_blockfp8.tools.quantize import _nvfp4_chunk

    w = torch.empty(64, 256, dtype=torch.bfloat16, device="meta")
    with pytest.raises(RuntimeError):
        _nvfp4_chunk(w, 0.5)
    q, scale, global_scale = make_qwen3_8b.nvfp4_quantize(w, 0.5)
    assert {t.device.type for t in (q, scale, global_scale)} == {"meta"}
    assert (q.shape, q.dtype, scale.shape, scale.dtype, global_scale.shape) == \
        ((64, 128), torch.uint8, (64, 16), torch.float8_e4m3fn, ())
    # On the CPU: the tool's bytes.
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    for a, b in zip(make_qwen3_8b.nvfp4_quantize(x, 7.0), _nvfp4_chunk(x, 7.0)):
        assert _same_bits(a, b)


@pytest.mark.usefixtures("vllm_dist")
def test_make_qwen3_nvfp4_checkpoint_resolves_and_loads_through_both_paths(tiny_q3, seeded):
    """vLLM resolves nvfp4/ to modelopt_fp4 with no --quantization (vllm-nvfp4) and to this plugin with
    --quantization blockfp8 (blockfp8-nvfp4), lm_head excluded in both; the checkpoint's q/k/v tensors load through
    the plugin's NVFP4 linear method (weight_loader, process_weights_after_loading) and apply() on the CPU matches
    the dequantized checkpoint."""
    import torch
    from test_config import _resolve
    from test_loading import _build, load
    from vllm.model_executor.layers.linear import QKVParallelLinear

    from vllm_blockfp8 import reference as ref
    from vllm_blockfp8.config import NVFP4, BlockFp8Config

    model = str(tiny_q3 / "nvfp4")
    method, vllm_cfg = _resolve(model, None)
    assert method == "modelopt_fp4" and vllm_cfg.is_layer_excluded("lm_head")
    assert not vllm_cfg.is_layer_excluded("model.layers.0.self_attn.qkv_proj")
    method, ours = _resolve(model, "blockfp8")
    assert method == "blockfp8" and isinstance(ours, BlockFp8Config) and ours.format == NVFP4
    assert ours.is_layer_ignored("lm_head") and not ours.is_layer_ignored("model.layers.0.self_attn.qkv_proj")

    fp4 = _tensors(tiny_q3 / "nvfp4")
    s = TINY_SHAPE
    layer = _build(QKVParallelLinear, 0, 1, ours, "model.layers.0.self_attn.qkv_proj", s["hidden"], s["head_dim"],
                   s["heads"], s["kv_heads"], bias=False)
    pre, dense = "model.layers.0.self_attn.", []
    for shard in ("q", "k", "v"):
        m = f"{pre}{shard}_proj"
        load(layer, {k: fp4[f"{m}.{k}"] for k in ("weight", "weight_scale", "weight_scale_2", "input_scale")}, shard)
        dense.append(ref.dequantize_nvfp4(fp4[f"{m}.weight"], fp4[f"{m}.weight_scale"], fp4[f"{m}.weight_scale_2"]))
    layer.quant_method.process_weights_after_loading(layer)
    x = torch.randn(3, s["hidden"], generator=seeded).to(torch.bfloat16)
    out = layer.quant_method.apply(layer, x)
    ref.assert_close_to_ref(out, x.double() @ torch.cat(dense).double().t(), "qkv_proj apply")
