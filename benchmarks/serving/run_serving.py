"""End-to-end serving benchmarks: this plugin vs vLLM's own FP8 and NVFP4 paths vs bf16, same GPU, same run.

Every measurement is one of vLLM's own benchmark commands (``python -m vllm.entrypoints.cli.main
bench ...``), run once per variant with identical engine arguments:

* ``latency``: ``bench latency``, batch 1, input 128, output 128 (decode-bound).
* ``throughput``: ``bench throughput``, random data: ``prefill`` (input 1024, output 1) and
  ``mixed`` (input 512, output 256); opt-in ``batch32`` (32 prompts, input 128, output 128: decode
  at batch 32, where weight-only NVFP4 GEMMs and Marlin meet at M = 32), which runs as ``bench latency
  --batch-size 32``: one such generation lasts ~1 s, so it is timed over the latency stage's
  iterations in one engine (``bench throughput`` of it moved 1.5x between two runs of one engine).
* ``serve``: ``vllm serve`` on 127.0.0.1, then ``bench serve`` (random data, input 512, output
  128) at max concurrency 1, 4, 16, 64.
* ``profile``: the prefill case (``bench throughput``, fewer prompts) and a batch-1 decode
  (``bench latency``, 8-token prompt, 128 tokens) under vLLM's torch profiler, then GPU kernel
  time by category per token per layer (kernel_profile.py): where each engine spends its time.
* ``--loadtest``: one variant served at high concurrency for N minutes, in rounds of ``bench
  serve``; exits 1 unless every request succeeded and the server is alive and healthy at the end.

Variants: ``blockfp8`` (FP8 checkpoint, --quantization blockfp8), ``vllm-fp8-block`` (alias
``fp8``: the same checkpoint through vLLM's own block-FP8 path), ``vllm-fp8-dyn`` (bf16 checkpoint,
--quantization fp8: per-tensor), ``bf16`` (alias ``none``), ``blockfp8-nvfp4`` (alias ``nvfp4``:
the ModelOpt NVFP4 checkpoint, --quantization blockfp8: this plugin's NVFP4 kernels) and
``vllm-nvfp4`` (alias ``marlin-fp4``: the same checkpoint, no --quantization, so vLLM picks
``modelopt_fp4`` from its config and its NVFP4 kernel by GPU: Marlin W4A16 on Hopper, CUTLASS /
FlashInfer FP4 from SM100 on). The NVFP4 checkpoint (``--nvfp4``, default the folder ``nvfp4``
beside ``--fp8block``) comes from ``make_qwen3_8b.py --nvfp4``. A bf16 directory without
safetensors is loaded with ``--load-format dummy`` (see make_qwen3_8b.py for why the FP8 and
NVFP4 ones never are: a variant whose quantized checkpoint has no weights is refused).

``--quick``: fewer iterations and prompts, the prefill throughput case only, a smaller CUDA-graph
set and no torch.compile (full CUDA graphs for decode only, ``-cc {"mode": 0, "cudagraph_mode":
"FULL_DECODE_ONLY"}``) so each of the 9 engine starts takes ~20-30 s: ~6 minutes for three
variants; numbers are indicative only. Pair it with a --layers 4 checkpoint.

Writes OUT/serving.json (every run, its command and its parsed metrics; rewritten after each run, so
a killed run keeps what finished), OUT/results.md, OUT/serving.png, OUT/logs/*.log (with
*.clock.csv beside each: the GPU's SM clock and power sampled during the run, summarized as each
record's ``gpu_clock``); prints a summary table last.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

if __package__:  # imported as benchmarks.serving.run_serving (the tests)
    from .kernel_profile import markdown as profile_markdown, summarize as profile_summary
else:  # run as a script: its own folder is on sys.path
    from kernel_profile import markdown as profile_markdown, summarize as profile_summary

VLLM = [sys.executable, "-m", "vllm.entrypoints.cli.main"]
ALIASES = {"fp8": "vllm-fp8-block", "none": "bf16", "nvfp4": "blockfp8-nvfp4",
           "marlin-fp4": "vllm-nvfp4"}
# variant -> (checkpoint, --quantization value or None)
VARIANTS = {"blockfp8": ("fp8block", "blockfp8"), "vllm-fp8-block": ("fp8block", None),
            "vllm-fp8-dyn": ("bf16", "fp8"), "bf16": ("bf16", None),
            "blockfp8-nvfp4": ("nvfp4", "blockfp8"), "vllm-nvfp4": ("nvfp4", None)}
# Each ours -> vLLM's own path on the same checkpoint: the ratios printed after the report.
PEERS = {"blockfp8": "vllm-fp8-block", "blockfp8-nvfp4": "vllm-nvfp4"}
# Throughput cases: (input len, output len, prompts).
THROUGHPUT_CASES = ("prefill", "mixed", "batch32")
FULL = dict(lat_iters=(3, 10), prefill=(1024, 1, 512), mixed=(512, 256, 256), batch32=(128, 128, 32),
            serve_len=(512, 128), prompts_per_conc=8, max_num_seqs=128, server_wait=420,
            profile_prompts=48)
QUICK = dict(lat_iters=(1, 3), prefill=(1024, 1, 128), mixed=(512, 128, 64), batch32=(128, 128, 32),
             serve_len=(512, 64), prompts_per_conc=3, max_num_seqs=64, server_wait=240,
             profile_prompts=16)
# Every engine logs the kernel row that serves each blockfp8 layer shape, once per shape (other
# variants never reach our ops, so the switch changes nothing there).
ENGINE_ENV = {"BLOCKFP8_LOG_ROWS": os.environ.get("BLOCKFP8_LOG_ROWS", "1")}
# Batch-1 latency replays only the size-1 decode graph. vLLM's DeepGEMM warmup JIT-compiles a
# kernel for every M up to max-num-batched-tokens (seen on the H200: > 5 minutes for a 36-layer
# model), so the latency stage skips it (VLLM_DEEP_GEMM_WARMUP=skip unless set) and captures a few
# graph sizes: what it needs is compiled in capture and in the untimed warmup iterations, the same
# for every variant. vLLM's default ("relax") warmup compiled 1735 DeepGEMM kernels in 28 minutes
# on a fresh H200 (2026-11-30), so the throughput stage skips it too and instead runs every
# variant once, untimed, with the same prompts: the timed run then finds every kernel it needs in
# the on-disk JIT caches and times what a warmed-up server would do. Every variant, not only the
# DeepGEMM one: the TRITON_ATTN backend JIT-compiles attention kernels on first use too, and the
# 2026-11-30 blockfp8 prefill profile on the H200 stalled 0.66 s and 0.64 s in two such compiles,
# inside the timed region of a run without this warm-up (benchmarks/results/serving/2026-11-30-x3).
LATENCY_CC = {"cudagraph_capture_sizes": [1, 2, 4, 8]}
# The batch32 case decodes 32 sequences that finish together: graphs up to 32 cover every step.
BATCH32_CC = {"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32]}
# Throughput cases short enough (~1 s a run) to be timed as one batch over `bench latency` iterations, with
# their graph sizes.
LATENCY_TIMED_CASES = {"batch32": BATCH32_CC}
DECODE_TOKENS = 128  # output tokens of every batch-1 latency run
FAST_START_CC = {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY",
                 "cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32, 64]}


class Bench:
    def __init__(self, a: argparse.Namespace):
        self.a, self.p = a, QUICK if a.quick else FULL
        self.t0 = time.time()
        self.gpu = gpu_name()
        self.runs: list[dict] = []
        (a.out / "logs").mkdir(parents=True, exist_ok=True)

    # -- plumbing -------------------------------------------------------------------------------
    def left(self) -> float:
        return self.a.budget_s - (time.time() - self.t0) if self.a.budget_s else 1e9

    def engine_args(self, variant: str) -> tuple[str, list[str]]:
        ckpt, quant = VARIANTS[variant]
        model = str(getattr(self.a, ckpt))
        args = ["--dtype", "bfloat16", "--max-model-len", "2048", "--seed", "0",
                "--max-num-seqs", str(self.p["max_num_seqs"]), "--no-enable-prefix-caching",
                "--gpu-memory-utilization", str(self.a.gpu_mem),
                "--attention-backend", self.a.attention_backend]
        args += ["--quantization", quant] if quant else []
        if ckpt == "bf16" and not any(Path(model).glob("*.safetensors")):
            args += ["--load-format", "dummy"]
        if self.a.quick and not self.a.compile:
            args += ["-cc", json.dumps(FAST_START_CC)]
        return model, args

    def run(self, name: str, cmd: list[str], cap: float,
            env: dict[str, str] | None = None) -> tuple[int, float, Path]:
        log = self.a.out / "logs" / f"{name}.log"
        cap = min(cap, self.left())
        if cap < 20:
            return 125, 0.0, log
        t = time.time()
        with open(log, "w") as f:
            env = {**ENGINE_ENV, **(env or {})}
            f.write("".join(f"{k}={v} " for k, v in env.items()) + shlex.join(cmd) + "\n\n")
            f.flush()
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                    env={**os.environ, **env})
            note_pid(proc.pid)
            sampler = start_clock_sampler(clock_log(log))
            try:
                rc = proc.wait(timeout=cap)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = 124
            except BaseException:  # interrupted (SIGTERM from an outer cap): take the run along
                stop(proc)
                raise
            finally:
                if sampler is not None:
                    stop(sampler)
        return rc, time.time() - t, log

    def record(self, **row) -> dict:
        if row["rc"] != 0:
            row["status"] = {124: "timeout", 125: "skipped (budget)"}.get(row["rc"], "failed")
            row["error"] = tail(row.get("log"))
        else:
            row["status"] = "ok"
        row["kernel_log"] = kernel_lines(row.get("log"))
        if row.get("log"):
            row["gpu_clock"] = clock_summary(clock_log(row["log"]))
        row["log"] = str(row.get("log", ""))
        self.runs.append(row)
        self.save()
        clock = row.get("gpu_clock") or {}
        clock_note = (f" [SM {clock['sm_mhz_median']:.0f} MHz, {clock['power_w_median']:.0f} W, "
                      f"{100 * clock['at_cap_share']:.0f}% at the power cap]" if clock.get("busy") else "")
        why = " ".join(filter(None, (row.get("note"), row.get("error"))))
        print(f"[serving] {row['stage']:<10} {row['variant']:<15} {row.get('case', ''):<8} "
              f"{row['status']} ({row.get('seconds', 0):.0f}s){clock_note} {why}", flush=True)
        return row

    def save(self) -> None:
        meta = {"quick": self.a.quick, "params": self.p, "fp8block": str(self.a.fp8block),
                "bf16": str(self.a.bf16), "nvfp4": str(getattr(self.a, "nvfp4", None) or ""),
                "gpu": self.gpu, "elapsed_s": time.time() - self.t0}
        (self.a.out / "serving.json").write_text(json.dumps({"meta": meta, "runs": self.runs},
                                                            indent=2, default=str))

    # -- stages ---------------------------------------------------------------------------------
    def latency_cmd(self, model: str, eargs: list[str], input_len: int, warm: int, iters: int,
                    extra: list[str], batch: int = 1, output_len: int = DECODE_TOKENS,
                    graphs: dict = LATENCY_CC) -> list[str]:
        """`vllm bench latency`: by default batch 1, 128 output tokens, the latency stage's graph sizes."""
        cc = [] if self.a.quick else ["-cc", json.dumps(graphs)]
        return [*VLLM, "bench", "latency", "--model", model, *eargs, *cc, "--batch-size", str(batch),
                "--input-len", str(input_len), "--output-len", str(output_len),
                "--num-iters-warmup", str(warm), "--num-iters", str(iters), *extra]

    def latency(self, v: str) -> None:
        model, eargs = self.engine_args(v)
        js = self.a.out / f"latency-{v}.json"
        warm, iters = self.p["lat_iters"]
        cmd = self.latency_cmd(model, eargs, 128, warm, iters, ["--output-json", str(js)])
        env = bench_env()
        js.unlink(missing_ok=True)  # an earlier run's result must not stand in for this one's
        rc, secs, log = self.run(f"latency-{v}", cmd, self.a.stage_cap_s, env)
        row = dict(stage="latency", variant=v, case="b1", rc=rc, seconds=secs, log=log, cmd=cmd,
                   env=env)
        row["rc"], r = bench_result(rc, js, row)
        if row["rc"] == 0:
            row.update(avg_latency_s=r["avg_latency"], p50_latency_s=r["percentiles"]["50"],
                       decode_tok_s=DECODE_TOKENS / r["avg_latency"])
        self.record(**row)

    def throughput_cmd(self, model: str, eargs: list[str], case: str, prompts: int,
                       extra: list[str]) -> list[str]:
        """`vllm bench throughput` on random data of one case's lengths."""
        il, ol, _ = self.p[case]
        # Prefill steps batch thousands of tokens, past every CUDA graph: a few graph sizes time
        # the same work and spare each engine its capture (and vLLM fp8 its DeepGEMM JIT of every
        # capture size), the same for every variant.
        cc = {"prefill": LATENCY_CC}.get(case) if not self.a.quick else None
        cc = ["-cc", json.dumps(cc)] if cc else []
        return [*VLLM, "bench", "throughput", "--model", model, *eargs, *cc, "--dataset-name",
                "random", "--random-input-len", str(il), "--random-output-len", str(ol),
                "--num-prompts", str(prompts), *extra]

    def batch_latency(self, v: str, case: str) -> None:
        """A case of LATENCY_TIMED_CASES, timed as one batch in ``bench latency``: the warm-up iterations in the
        same engine take the JIT compiles, and the average of the timed ones gives the rates."""
        model, eargs = self.engine_args(v)
        il, ol, n = self.p[case]
        js = self.a.out / f"throughput-{case}-{v}.json"
        warm, iters = self.p["lat_iters"]
        cmd = self.latency_cmd(model, eargs, il, warm, iters, ["--output-json", str(js)], batch=n,
                               output_len=ol, graphs=LATENCY_TIMED_CASES[case])
        env = bench_env()
        js.unlink(missing_ok=True)  # an earlier run's result must not stand in for this one's
        rc, secs, log = self.run(f"throughput-{case}-{v}", cmd, self.a.stage_cap_s, env)
        row = dict(stage="throughput", variant=v, case=case, rc=rc, seconds=secs, log=log, cmd=cmd,
                   env=env, jit_warmup_run=f"{warm} untimed iterations in the same engine")
        row["rc"], r = bench_result(rc, js, row)
        if row["rc"] == 0:
            el = r["avg_latency"]
            row.update(elapsed_s=el, p50_latency_s=r["percentiles"]["50"], tok_s=n * (il + ol) / el,
                       req_s=n / el, input_tok_s=n * il / el, output_tok_s=n * ol / el)
        self.record(**row)

    def throughput(self, v: str) -> None:
        model, eargs = self.engine_args(v)
        for case in self.a.throughput_cases.split(","):
            if case in LATENCY_TIMED_CASES:
                self.batch_latency(v, case)
                continue
            il, ol, n = self.p[case]
            js = self.a.out / f"throughput-{case}-{v}.json"
            cmd = self.throughput_cmd(model, eargs, case, n, ["--output-json", str(js)])
            env = bench_env()
            wrc, wsecs, _ = self.run(f"throughput-{case}-{v}-jit-warmup", cmd, self.a.stage_cap_s, env)
            warm = dict(rc=wrc, seconds=round(wsecs, 1))
            js.unlink(missing_ok=True)  # the warm-up wrote the same file: only the timed run's result counts
            rc, secs, log = self.run(f"throughput-{case}-{v}", cmd, self.a.stage_cap_s, env)
            row = dict(stage="throughput", variant=v, case=case, rc=rc, seconds=secs, log=log,
                       cmd=cmd, env=env, jit_warmup_run=warm)
            row["rc"], r = bench_result(rc, js, row)
            if row["rc"] == 0:
                el = r["elapsed_time"]
                row.update(elapsed_s=el, tok_s=r["tokens_per_second"],
                           req_s=r["requests_per_second"], input_tok_s=n * il / el,
                           output_tok_s=n * ol / el)
            self.record(**row)

    def profile(self, v: str) -> None:
        """Each case of --profile-cases under the torch profiler (kernels only, no stacks),
        summarized per token per layer: ``prefill`` is the throughput stage's prefill case with
        fewer prompts; ``decode`` one batch-1 generation of 128 tokens after an 8-token prompt (so
        the prefill's kernels are a small part), with the latency stage's graph sizes."""
        model, eargs = self.engine_args(v)
        env = bench_env()
        for case in self.a.profile_cases.split(","):
            name = f"profile-{case}-{v}"
            trace_dir = (self.a.out / f"prof-{case}-{v}").resolve()  # vLLM wants an absolute path
            cfg = ["--profile", "--profiler-config", json.dumps({
                "profiler": "torch", "torch_profiler_dir": str(trace_dir),
                "torch_profiler_with_stack": False, "torch_profiler_use_gzip": True,
                "torch_profiler_dump_cuda_time_total": False})]
            if case == "prefill":
                n = self.a.profile_prompts or self.p["profile_prompts"]
                cmd, tokens = self.throughput_cmd(model, eargs, "prefill", n, cfg), n * self.p["prefill"][0]
            else:
                cmd, tokens = self.latency_cmd(model, eargs, 8, 1, 1, cfg), DECODE_TOKENS
            rc, secs, log = self.run(name, cmd, self.a.stage_cap_s, env)
            row = dict(stage="profile", variant=v, case=case, rc=rc, seconds=secs, log=log, cmd=cmd,
                       env=env, tokens=tokens)
            if rc == 0:
                s = profile_summary(trace_dir, tokens=tokens, layers=model_layers(model))
                if s["trace_files"]:
                    (self.a.out / f"{name}.json").write_text(json.dumps(s, indent=2))
                    (self.a.out / f"{name}.md").write_text(profile_markdown(s) + "\n")
                    row.update(kernel_us=s["kernel_us"], layers=s["layers"], unit=s["unit"],
                               categories={c["category"]: c["per"] for c in s["categories"]})
                else:
                    row.update(rc=1, note=f"no trace under {trace_dir}")
            self.record(**row)

    def start_server(self, v: str, tag: str):
        model, eargs = self.engine_args(v)
        port = free_port(self.a.port)
        log = self.a.out / "logs" / f"server-{tag}-{v}.log"
        cmd = [*VLLM, "serve", model, "--host", "127.0.0.1", "--port", str(port),
               "--served-model-name", "m", *eargs]
        f = open(log, "w")
        f.write("".join(f"{k}={v} " for k, v in ENGINE_ENV.items()) + shlex.join(cmd) + "\n\n")
        f.flush()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **ENGINE_ENV})
        note_pid(proc.pid)
        t, wait = time.time(), min(self.p["server_wait"], self.left())
        try:
            while time.time() - t < wait:
                if proc.poll() is not None:
                    break
                if healthy(port):
                    return proc, port, model, log, time.time() - t
                time.sleep(2)
        except BaseException:
            stop(proc)
            raise
        stop(proc)
        return None, port, model, log, time.time() - t

    def serve_once(self, v: str, port: int, model: str, name: str, conc: int, n: int,
                   ratio: float, cap: float) -> tuple[dict, dict | None]:
        il, ol = self.p["serve_len"]
        cmd = [*VLLM, "bench", "serve", "--backend", "openai",
               "--base-url", f"http://127.0.0.1:{port}", "--model", "m", "--tokenizer", model,
               "--dataset-name", "random", "--random-input-len", str(il),
               "--random-output-len", str(ol), "--random-range-ratio", str(ratio),
               "--num-prompts", str(n), "--max-concurrency", str(conc), "--request-rate", "inf",
               "--ignore-eos", "--num-warmups", str(min(conc, 4)), "--disable-tqdm",
               "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
               "--save-result", "--result-dir", str(self.a.out), "--result-filename",
               f"{name}.json"]
        rc, secs, log = self.run(name, cmd, cap)
        row = dict(stage="serve", variant=v, case=f"c{conc}", concurrency=conc, rc=rc,
                   seconds=secs, log=log, cmd=cmd)
        r = None
        res = self.a.out / f"{name}.json"
        if rc == 0 and res.exists():
            r = json.loads(res.read_text())
            # Per-request arrays (ITLs of every token) reach megabytes in a load test: keep
            # the scalars, and the distinct errors.
            errors = sorted({e for e in r.get("errors") or [] if e})[:20]
            res.write_text(json.dumps({k: x for k, x in r.items() if not isinstance(x, list)}
                                      | {"distinct_errors": errors}, indent=2))
            r["errors"] = [e for e in r.get("errors") or [] if e]
            row.update({k: r.get(k) for k in (
                "completed", "failed", "request_throughput", "output_throughput",
                "total_token_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms",
                "p99_tpot_ms", "median_itl_ms", "median_e2el_ms", "duration")})
        return row, r

    def serve(self, v: str) -> None:
        proc, port, model, log, up = self.start_server(v, "sweep")
        if proc is None:
            self.record(stage="serve", variant=v, case="start", rc=1, seconds=up, log=log)
            return
        try:
            print(f"[serving] server {v} up in {up:.0f}s on :{port}", flush=True)
            for conc in self.a.concurrency:
                n = max(conc * self.p["prompts_per_conc"], 8)
                row, _ = self.serve_once(v, port, model, f"serve-{v}-c{conc}", conc, n, 0.0,
                                         self.a.stage_cap_s)
                self.record(server_start_s=up, **row)
        finally:
            stop(proc)

    def loadtest(self) -> int:
        v = ALIASES.get(self.a.loadtest_variant, self.a.loadtest_variant)
        proc, port, model, log, up = self.start_server(v, "loadtest")
        if proc is None:
            self.record(stage="loadtest", variant=v, case="start", rc=1, seconds=up, log=log)
            return 1
        conc, deadline = self.a.loadtest_concurrency, time.time() + 60 * self.a.minutes
        totals, errors, rounds, n = {"completed": 0, "failed": 0}, {}, 0, conc * 4
        try:
            while rounds == 0 or time.time() < deadline - 10:
                rounds += 1
                row, r = self.serve_once(v, port, model, f"loadtest-{v}-r{rounds}", conc, n, 0.5,
                                         max(deadline - time.time() + 120, 60))
                row.update(stage="loadtest", case=f"r{rounds}")
                self.record(**row)
                if r is None:
                    totals["failed"] += n
                    break
                totals["completed"] += r["completed"]
                totals["failed"] += r["failed"]
                for e in r.get("errors") or []:
                    if e:
                        errors[e[:200]] = errors.get(e[:200], 0) + 1
                per_req = max(r["duration"], 1e-3) / max(n, 1)
                n = max(conc, int(min(60.0, deadline - time.time()) / per_req))
            alive, health = proc.poll() is None, healthy(port)
        finally:
            stop(proc)
        text = log.read_text(errors="replace")
        verdict = totals["failed"] == 0 and totals["completed"] > 0 and alive and health
        summary = dict(stage="loadtest-summary", variant=v, case=f"c{conc}", rc=0 if verdict else 1,
                       seconds=time.time() - self.t0, log=log, rounds=rounds,
                       server_alive=alive, health=health, errors=errors,
                       server_log_tracebacks=text.count("Traceback"), **totals)
        summary["verdict"] = (f"LOADTEST {'PASS' if verdict else 'FAIL'}: {v}, concurrency {conc}, "
                              f"{self.a.minutes} min, {rounds} rounds, {totals['completed']} "
                              f"completed, {totals['failed']} failed, server alive={alive} "
                              f"healthy={health}")
        self.record(**summary)
        return 0 if verdict else 1


# -- helpers --------------------------------------------------------------------------------------
def bench_result(rc: int, path: Path, row: dict) -> tuple[int, dict | None]:
    """(rc, result JSON) of one `vllm bench` run. A run the cap killed after it wrote its result
    counts (engine shutdown can outlast the budget; the numbers are final once written); one that
    exited 0 without a readable result does not. Either case leaves a note in row."""
    try:
        result = json.loads(Path(path).read_text())
    except (OSError, ValueError):  # missing, or cut short mid-write
        result = None
    if rc == 124 and result is not None:
        row["note"] = "result written; stopped at the cap during engine shutdown"
        return 0, result
    if rc == 0 and result is None:
        row["note"] = "exited 0 without writing its result JSON"
        return 1, None
    return rc, result


def tail(log, n: int = 3) -> str:
    p = Path(log) if log else None
    if not p or not p.exists():
        return ""
    lines = [ln.strip() for ln in p.read_text(errors="replace").splitlines() if ln.strip()]
    return " | ".join(lines[-n:])[-300:]


# vLLM 0.26 names its NVFP4 linear kernel once per engine (kernels/linear/__init__.py,
# init_nvfp4_linear_kernel): "Using MarlinNvFp4LinearKernel for NVFP4 GEMM" (or Cutlass /
# FlashInferCutlass / FlashInferCuteDsl ...NvFp4LinearKernel), and Marlin adds the warning "Your GPU
# does not have native support for FP4 computation but FP4 quantization is being used. Weight-only
# FP4 compression will be used leveraging the Marlin kernel. ..." (kernels/linear/nvfp4/marlin.py).
# This plugin's NVFP4 lines start "blockfp8: NVFP4 runs ...".
KERNEL_HINT = re.compile(r"(?i)deep_?gemm|cutlass|blockfp8|fp8.*(kernel|linear|backend)"
                         r"|for nvfp4 gemm|nvfp4linearkernel|native support for fp4|marlin|flashinfer")


def kernel_lines(log, n: int = 12) -> list[str]:
    """The log lines that say which GEMM backend each variant ended up on (first n)."""
    p = Path(log) if log else None
    if not p or not p.exists():
        return []
    hits = [ln.strip()[-200:] for ln in p.read_text(errors="replace").splitlines()
            if KERNEL_HINT.search(ln) and "args" not in ln and not ln.startswith(VLLM[0])]
    return list(dict.fromkeys(hits))[:n]


# SM clock and board power during each run (nvidia-smi, 5 samples per second, the GPUs of
# CUDA_VISIBLE_DEVICES): the H200 holds 700 W by lowering the SM clock (1.5-1.65 GHz at the cap vs
# 1.98 GHz below it, benchmarks/results/serving/2026-11-30-x5), so two engines can run the same
# kernel at different speeds; the summary in each run's record says whether they did. The same
# query as dev/device/h200_check.sh's per-stage logs, so clock_summary reads those too.
CLOCK_QUERY = "index,timestamp,clocks.sm,power.draw"
BUSY_W = 200.0  # samples below this are an idle or loading GPU, left out of the summary
AT_CAP_W = 680.0


def clock_log(log) -> Path:
    return Path(log).with_suffix(".clock.csv")


def start_clock_sampler(path: Path):
    """nvidia-smi writing CLOCK_QUERY rows to path until stop(); None where there is no nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return None
    cmd = ["nvidia-smi", f"--query-gpu={CLOCK_QUERY}", "--format=csv,noheader,nounits", "-lms", "200"]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible and all(x.strip().isdigit() for x in visible.split(",")):
        cmd += ["-i", visible]
    try:
        with open(path, "w") as f:
            return subprocess.Popen(cmd, stdout=f, stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        return None


def clock_summary(path: Path) -> dict | None:
    """Median SM clock (MHz) and power (W) over the busy samples (power >= BUSY_W), and the share of
    them at the power cap; None without samples."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return None
    busy = []
    for line in lines:
        try:  # the last two fields: SM clock and power (CLOCK_QUERY)
            mhz, watts = (float(x) for x in line.split(",")[-2:])
        except ValueError:  # a header, "[N/A]" or a partial last line
            continue
        if watts >= BUSY_W:
            busy.append((mhz, watts))
    if not busy:
        return {"samples": len(lines), "busy": 0}
    mhz, watts = sorted(m for m, _ in busy), sorted(w for _, w in busy)
    return {"samples": len(lines), "busy": len(busy), "sm_mhz_median": mhz[len(mhz) // 2],
            "sm_mhz_min": mhz[0], "power_w_median": watts[len(watts) // 2],
            "at_cap_share": sum(w >= AT_CAP_W for w in watts) / len(watts)}


def note_pid(pid: int) -> None:
    """Append a started session's pid to $BLOCKFP8_PIDFILE, so a caller that had to SIGKILL this
    script (dev/device/h200_e2e.sh) can still end the vLLM server it left behind, by id."""
    path = os.environ.get("BLOCKFP8_PIDFILE")
    if path:
        with open(path, "a") as f:
            f.write(f"{pid}\n")


def healthy(port: int) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def stop(proc) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def bench_env() -> dict[str, str]:
    """The environment of every `vllm bench` run: DeepGEMM's warmup skipped unless set (the
    comment above LATENCY_CC says why and what replaces it)."""
    return {"VLLM_DEEP_GEMM_WARMUP": os.environ.get("VLLM_DEEP_GEMM_WARMUP", "skip")}


def model_layers(model: str) -> int | None:
    """num_hidden_layers from the checkpoint's config.json (None when it cannot be read)."""
    try:
        return int(json.loads((Path(model) / "config.json").read_text())["num_hidden_layers"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def peer_ratios(runs: list[dict]) -> list[str]:
    """One line per (stage, case) where one of our variants and its vLLM peer (PEERS) both
    measured: ours / peer on the stage's higher-is-better metric. report_serving's tables take
    their ratios against vllm-fp8-block only; this puts blockfp8-nvfp4 beside vllm-nvfp4 too."""
    metric = {"latency": "decode_tok_s", "throughput": "tok_s", "serve": "output_throughput"}
    got = {(r["stage"], r.get("case"), r["variant"]): r.get(metric.get(r["stage"], ""))
           for r in runs if r.get("status") == "ok"}
    lines = []
    for (stage, case, v), value in got.items():
        peer = got.get((stage, case, PEERS.get(v)))
        if value and peer:
            lines.append(f"{stage} {case}: {v} / {PEERS[v]} = {value / peer:.3f}x "
                         f"({metric[stage]} {value:.4g} vs {peer:.4g})")
    return lines


def write_peer_ratios(out: Path, runs: list[dict]) -> None:
    lines = peer_ratios(runs)
    if lines:
        text = "\n".join(f"- {ln}" for ln in lines)
        with open(out / "results.md", "a") as f:
            f.write(f"\n## Ours against vLLM's own path on the same checkpoint\n\n{text}\n")
        print("\nOURS / VLLM PEER (same checkpoint)\n" + "\n".join(lines))


def free_port(preferred: int) -> int:
    for port in (preferred, 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return s.getsockname()[1]
            except OSError:
                continue
    raise RuntimeError("no free port")


def gpu_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[2:]))
    ap.add_argument("--fp8block", type=Path, required=True, help="block-FP8 checkpoint directory")
    ap.add_argument("--bf16", type=Path, required=True,
                    help="bf16 checkpoint directory (without safetensors: --load-format dummy)")
    ap.add_argument("--nvfp4", type=Path, default=None,
                    help="ModelOpt NVFP4 checkpoint directory (make_qwen3_8b.py --nvfp4) for "
                         "blockfp8-nvfp4 / vllm-nvfp4; default: nvfp4 beside --fp8block")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--variants", default="blockfp8,vllm-fp8-block,bf16",
                    help=f"comma list of {list(VARIANTS)} (aliases {ALIASES})")
    ap.add_argument("--stages", default="latency,throughput,serve")
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")],
                    default=[1, 4, 16, 64])
    ap.add_argument("--throughput-cases", default=None,
                    help="of prefill, mixed, batch32: prefill,mixed (default; --quick: prefill only, "
                         "to fit ~6 minutes)")
    ap.add_argument("--profile-cases", default="prefill,decode",
                    help="cases of the profile stage: prefill, decode")
    ap.add_argument("--profile-prompts", type=int, default=0,
                    help="prompts of the profiled prefill case (default 48, --quick 16; the throughput "
                         "case's 512 profiles every step of that run, with a large trace)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--compile", action="store_true", help="keep torch.compile in --quick")
    ap.add_argument("--gpu-mem", type=float, default=0.85)
    ap.add_argument("--attention-backend", default="TRITON_ATTN")
    ap.add_argument("--port", type=int, default=8011)
    ap.add_argument("--budget-s", type=float, default=0,
                    help="stop starting runs when this much wall time is spent (0: no limit)")
    ap.add_argument("--stage-cap-s", type=float, default=420, help="cap per benchmark command")
    ap.add_argument("--loadtest", action="store_true", help="run the load test instead")
    ap.add_argument("--loadtest-variant", default="blockfp8")
    ap.add_argument("--loadtest-concurrency", type=int, default=128)
    ap.add_argument("--minutes", type=float, default=3.0, help="load test duration")
    a = ap.parse_args()
    a.throughput_cases = a.throughput_cases or ("prefill" if a.quick else "prefill,mixed")
    variants = [ALIASES.get(v, v) for v in a.variants.split(",") if v]
    bad = [v for v in variants if v not in VARIANTS] + [
        s for s in a.stages.split(",") if s not in ("latency", "throughput", "serve", "profile")] + [
        c for c in a.throughput_cases.split(",") if c not in THROUGHPUT_CASES] + [
        c for c in a.profile_cases.split(",") if c not in ("prefill", "decode")]
    if bad:
        ap.error(f"unknown variant or stage: {bad}")
    a.nvfp4 = a.nvfp4 or a.fp8block.parent / "nvfp4"
    used = variants + ([ALIASES.get(a.loadtest_variant, a.loadtest_variant)] if a.loadtest else [])
    for ckpt in ("fp8block", "nvfp4"):  # never dummy-loaded: a quantized checkpoint needs its weights
        need = [v for v in used if VARIANTS.get(v, ("",))[0] == ckpt]
        if need and not any(Path(getattr(a, ckpt)).glob("*.safetensors")):
            how = "make_qwen3_8b.py --nvfp4" if ckpt == "nvfp4" else "make_qwen3_8b.py"
            ap.error(f"{', '.join(need)} need --{ckpt} with weights: {getattr(a, ckpt)} has no "
                     f"*.safetensors (write it with {how})")
    bench = Bench(a)
    # SIGTERM (an outer `timeout`) unwinds through finally blocks: servers stop, summary prints.
    signal.signal(signal.SIGTERM, _interrupt)
    rc = 0
    try:
        if a.loadtest:
            rc = bench.loadtest()
        else:
            for stage in [s for s in a.stages.split(",") if s]:
                for v in variants:
                    getattr(bench, stage)(v)
    except KeyboardInterrupt:
        print("[serving] interrupted: writing what finished", flush=True)
        rc = 130
    finally:
        bench.save()
        from report_serving import write_report

        write_report(a.out, bench.runs)
        write_peer_ratios(a.out, bench.runs)
    return rc or (0 if all(r["status"] == "ok" for r in bench.runs) else 1)


if __name__ == "__main__":
    sys.exit(main())
