"""Every documented runtime switch under vllm.LLM on a GPU, in one device call: each case runs the demo (`python -m
vllm_blockfp8 demo`: a random-weight Qwen3-shaped checkpoint served by vllm.LLM with torch.compile and CUDA graphs)
in a fresh process with the case's environment, and checks what the case promises in the process's output. A table is
printed last; the exit status is 1 when any case failed.

    python dev/device/switches.py [--jobs J] [--cases NAME,...] [--json OUT] [--timeout S]

Cases (what each checks, besides "the engine served every prompt"):
  gemm_sm90       BLOCKFP8_GEMM_TABLE=sm90: the prefill's linears ran the W8A8 GEMM on an sm90_ row
  gemm_none       BLOCKFP8_GEMM_TABLE=none: no sm90_/sm89_ row ran (the prefill took dequantize + cuBLAS)
  gemm_sm89       BLOCKFP8_GEMM_TABLE=sm89 (the SM89 rows run on SM90 too): the prefill ran an sm89_ row
  tuned_none      BLOCKFP8_TUNED_CONFIG=none and BLOCKFP8_SELF_CHECK=inprocess: serves, the check in the process
  log_rows_off    BLOCKFP8_LOG_ROWS=0: serves and logs no row
  force_linear    BLOCKFP8_FORCE=linear:dequant_matmul: the only linear row logged is dequant_matmul
  force_unknown   BLOCKFP8_FORCE=linear:no_such_row: the engine does not start; one error names the switch and
                  lists the valid linear rows
  self_check_always  BLOCKFP8_SELF_CHECK=always: the first-use check runs once, in a child process, before the engine
                  serves; every row of this GPU's tables passes; its start-up seconds are reported
  corrupt_row     BLOCKFP8_SELF_CHECK=always with BLOCKFP8_SELF_CHECK_CORRUPT=<the sm90_ row gemm_sm90 saw>: one
                  warning names the row, the row never serves, and where it was the only GEMM row at prefill the
                  tokens equal gemm_none's (its shapes then run dequantize + cuBLAS, as every shape does there)
  serve_force     `vllm serve` on the demo's checkpoint with BLOCKFP8_FORCE=linear:dequant_matmul: /v1/completions
                  answers 200 with tokens, and the server's row lines show only the forced row
  serve_unknown   `vllm serve` with BLOCKFP8_FORCE=linear:no_such_row: the server exits at startup, its error names the
                  switch and lists the valid linear rows
  nvfp4_w4a16     BLOCKFP8_NVFP4_W4A16=1 on the NVFP4 demo: serves weight-only (the GEMV at decode, a W4A16 row at
                  prefill)
A garbage tuned file is tests/test_vllm_gpu.py's.

--jobs J runs J cases at once (each engine asks for 30% of the GPU's memory; default 1: vLLM sizes its KV cache from
the free memory it measures, which another engine starting beside it can disturb). corrupt_row runs last, after
gemm_sm90 and gemm_none (added when not asked for). About 60-100 s per case on the H200: two device calls,
e.g. --cases gemm_sm90,gemm_none,corrupt_row,force_linear,force_unknown,serve_unknown and --cases gemm_sm89,
tuned_none,log_rows_off,nvfp4_w4a16,serve_force.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

GENERATED = re.compile(r"generated \[([0-9, ]+)\]")
PREFILL_M = r"M=(?:1[7-9]|[2-9]\d|\d{3,})"  # the engine's prefill shapes (the demo's prompts and profile run)


def demo_cmd(fmt: str) -> list:
    return [sys.executable, "-m", "vllm_blockfp8", "demo", "--format", fmt, "--max-tokens", "8"]


def tokens(log: str) -> list:
    return GENERATED.findall(log)


def served(res) -> str | None:
    if res.returncode != 0:
        return f"exit status {res.returncode}"
    if res.stdout.startswith("served: 200"):  # serve_once: the completion answered with choices
        return None
    return None if tokens(res.stdout) else "no generated tokens in the output"


def expect(pattern: str, what: str):
    def check(res, log, seen):
        return None if re.search(pattern, log) else f"no {what} in the log"
    return check


def check_gemm_sm90(res, log, seen):
    rows = re.findall(rf"\[blockfp8\] gemm N=\d+ K=\d+ {PREFILL_M} -> (sm90_\w+)", log)
    if not rows:
        return "the prefill ran no sm90_ GEMM row"
    seen["sm90_rows"] = sorted(set(rows))
    return None


def check_gemm_none(res, log, seen):
    if re.search(r"-> (sm90_|sm89_)", log):
        return "a W8A8 GEMM row ran under BLOCKFP8_GEMM_TABLE=none"
    seen["none_tokens"] = tokens(log)
    return None


def check_log_rows_off(res, log, seen):
    return "row lines logged under BLOCKFP8_LOG_ROWS=0" if "[blockfp8] linear N=" in log else None


def check_force_linear(res, log, seen):
    picks = re.findall(r"\[blockfp8\] linear N=\d+ K=\d+ M=(\d+) -> (\w+)", log)
    if not picks:
        return "no linear row lines"
    # One line per (row, N, K), at the first call's M: a forced family logs only the forced row.
    others = sorted({row for _, row in picks if row != "dequant_matmul"})
    return f"rows other than the forced one ran: {others}" if others else None


def check_force_unknown(res, log, seen):
    if res.returncode == 0:
        return "the engine started with an unknown forced row"
    if "BLOCKFP8_FORCE: no linear row 'no_such_row'" not in log or "valid linear rows: " not in log:
        return "no error naming the switch and listing the valid rows"
    return None


FIRST_USE = re.compile(r"\[blockfp8\] first-use check: (\d+) rows in a child process, (\d+) passed in ([0-9.]+) s"
                       r"(?:, failed: ([^(]*))?")


def check_self_check(res, log, seen):
    found = FIRST_USE.findall(log)
    if len(found) != 1:
        return f"{len(found)} first-use summary lines (one expected: the check ran once, in a child process)"
    rows, passed, seconds, failed = found[0]
    if int(rows) == 0 or rows != passed:
        return f"the first-use check passed {passed} of {rows} rows (failed: {failed.strip()})"
    seen["self_check"] = {"rows": int(rows), "seconds": float(seconds)}
    return None


def check_corrupt(res, log, seen):
    row = seen["sm90_rows"][0]
    found = FIRST_USE.findall(log)
    if len(found) != 1 or row not in found[0][3].strip().split(", "):
        return f"the first-use summary does not name {row} as the one failed row ({found})"
    warnings = [line for line in log.splitlines() if f"row {row} failed its first-use self-check" in line]
    if len(warnings) != 1:
        return f"{len(warnings)} first-use warnings name {row} (one expected)"
    if re.search(rf"gemm N=\d+ K=\d+ M=\d+ -> {row}\b", log):
        return f"{row} still served after failing its check"
    # With one GEMM row at prefill, its shapes now take dequantize + cuBLAS, as every shape does under
    # BLOCKFP8_GEMM_TABLE=none: the same kernels, so the same greedy tokens.
    if len(seen["sm90_rows"]) == 1 and "none_tokens" in seen and tokens(log) != seen["none_tokens"]:
        return "the tokens differ from the BLOCKFP8_GEMM_TABLE=none run's (the same kernels)"
    return None


def check_nvfp4(res, log, seen):
    if not re.search(r"\[blockfp8\] nvfp4 N=\d+ K=\d+ M=\d+ -> fp4_gemv", log):
        return "no fp4_gemv row (decode)"
    if not re.search(rf"\[blockfp8\] nvfp4 N=\d+ K=\d+ {PREFILL_M} -> fp4_(?!gemv)", log):
        return "no weight-only fp4_ GEMM row at prefill"
    return None


def serve_cmd(model_dir: Path, port: int) -> list:
    return [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(model_dir), "--quantization", "blockfp8",
            "--port", str(port), "--max-model-len", "512", "--gpu-memory-utilization", "0.3", "--skip-tokenizer-init",
            "--kv-cache-memory-bytes", str(256 << 20)]  # as the demo: no memory profiling beside other GPU work


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_once(env: dict, timeout: float, cmd=serve_cmd):
    """Start `vllm serve` on a fresh demo checkpoint, wait for /health, send one completion (prompt token ids: the
    checkpoint has no tokenizer), stop the server. Returns (a CompletedProcess-like result whose returncode is 0
    when the request answered 200 with tokens, 1 otherwise; the server's output)."""
    from vllm_blockfp8 import demo

    with tempfile.TemporaryDirectory(prefix="blockfp8-switch-") as tmp:
        model = demo.write_checkpoint(Path(tmp) / "model")
        port, log_path = free_port(), Path(tmp) / "server.log"
        with open(log_path, "w") as log_file:
            server = subprocess.Popen(cmd(model, port), stdout=log_file, stderr=subprocess.STDOUT, env=env)
            answer, deadline = None, time.time() + timeout
            try:
                while time.time() < deadline and server.poll() is None and answer is None:
                    try:
                        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
                    except OSError:
                        time.sleep(2)
                        continue
                    body = json.dumps({"model": str(model), "prompt": list(demo.PROMPTS[0]), "max_tokens": 8,
                                       "temperature": 0.0}).encode()
                    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                                 {"Content-Type": "application/json"})
                    with urllib.request.urlopen(req, timeout=120) as resp:
                        answer = (resp.status, json.loads(resp.read()))
            except OSError as exc:
                answer = (getattr(exc, "code", 0), {"error": str(exc)})
            finally:
                if server.poll() is None:
                    server.terminate()
                    try:
                        server.wait(timeout=60)
                    except subprocess.TimeoutExpired:
                        server.kill()
        log = log_path.read_text(errors="replace")
    ok = answer is not None and answer[0] == 200 and bool(answer[1].get("choices"))
    out = f"served: {answer[0]} {json.dumps(answer[1])[:300]}\n" if answer else "served: no answer\n"
    return subprocess.CompletedProcess(cmd(Path("model"), 0), 0 if ok else 1, out + log, ""), out + log


def check_serve_force(res, log, seen):
    return check_force_linear(res, log, seen)


def check_serve_unknown(res, log, seen):
    if log.startswith("served: 200"):
        return "the server answered with an unknown forced row"
    return check_force_unknown(subprocess.CompletedProcess([], 1), log, seen)


# name -> (demo format, or "serve": `vllm serve` on the demo's fp8-block checkpoint; environment; check; expected to
# serve). corrupt_row's environment is filled in from gemm_sm90.
CASES = {
    "gemm_sm90": ("fp8-block", {"BLOCKFP8_GEMM_TABLE": "sm90"}, check_gemm_sm90, True),
    "gemm_none": ("fp8-block", {"BLOCKFP8_GEMM_TABLE": "none"}, check_gemm_none, True),
    "gemm_sm89": ("fp8-block", {"BLOCKFP8_GEMM_TABLE": "sm89"},
                  expect(rf"\[blockfp8\] gemm N=\d+ K=\d+ {PREFILL_M} -> sm89_", "sm89_ GEMM row at prefill"), True),
    "tuned_none": ("fp8-block", {"BLOCKFP8_TUNED_CONFIG": "none", "BLOCKFP8_SELF_CHECK": "inprocess"},
                   expect(r"\[blockfp8\] linear N=", "row line"), True),
    "log_rows_off": ("fp8-block", {"BLOCKFP8_LOG_ROWS": "0"}, check_log_rows_off, True),
    "force_linear": ("fp8-block", {"BLOCKFP8_FORCE": "linear:dequant_matmul"}, check_force_linear, True),
    "force_unknown": ("fp8-block", {"BLOCKFP8_FORCE": "linear:no_such_row"}, check_force_unknown, False),
    "self_check_always": ("fp8-block", {"BLOCKFP8_SELF_CHECK": "always"}, check_self_check, True),
    "corrupt_row": ("fp8-block", {"BLOCKFP8_SELF_CHECK": "always"}, check_corrupt, True),
    "serve_force": ("serve", {"BLOCKFP8_FORCE": "linear:dequant_matmul"}, check_serve_force, True),
    "serve_unknown": ("serve", {"BLOCKFP8_FORCE": "linear:no_such_row"}, check_serve_unknown, False),
    "nvfp4_w4a16": ("nvfp4", {"BLOCKFP8_NVFP4_W4A16": "1"}, check_nvfp4, True),
}


def run_case(name: str, seen: dict, timeout: float, cmd_for=demo_cmd, serve_for=serve_cmd) -> dict:
    fmt, env_extra, check, serves = CASES[name]
    env = {**os.environ, "BLOCKFP8_LOG_ROWS": "1", **env_extra}
    if name == "corrupt_row":
        if not seen.get("sm90_rows"):
            return dict(case=name, ok=False, seconds=0.0, why="gemm_sm90 saw no sm90_ row to corrupt")
        env["BLOCKFP8_SELF_CHECK_CORRUPT"] = seen["sm90_rows"][0]
    t0 = time.time()
    try:
        if fmt == "serve":
            res, log = serve_once(env, timeout, serve_for)
        else:
            res = subprocess.run(cmd_for(fmt), capture_output=True, text=True, env=env, timeout=timeout)
            log = res.stdout + res.stderr
    except subprocess.TimeoutExpired:
        return dict(case=name, ok=False, seconds=time.time() - t0, why=f"timed out after {timeout:.0f} s")
    why = served(res) if serves else None
    why = why or check(res, log, seen)
    check_cost = seen.get("self_check") if name == "self_check_always" else None
    note = f"first-use check: {check_cost['rows']} rows, {check_cost['seconds']:.1f} s" if check_cost else ""
    return dict(case=name, ok=why is None, seconds=round(time.time() - t0, 1), why=why or "", note=note,
                env=env_extra, log_tail=log[-4000:] if why else "")


def run_all(names: list, jobs: int, timeout: float, cmd_for=demo_cmd, serve_for=serve_cmd) -> list:
    seen: dict = {}
    first = [n for n in names if n != "corrupt_row"]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(lambda n: run_case(n, seen, timeout, cmd_for, serve_for), first))
    if "corrupt_row" in names:
        results.append(run_case("corrupt_row", seen, timeout, cmd_for, serve_for))
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--cases", default=",".join(CASES), help="comma list of " + ", ".join(CASES))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--timeout", type=float, default=420.0, help="seconds per case")
    args = ap.parse_args(argv)
    names = [n for n in args.cases.split(",") if n]
    bad = [n for n in names if n not in CASES]
    if bad:
        ap.error(f"unknown cases {bad}; cases: {', '.join(CASES)}")
    if "corrupt_row" in names:  # gemm_sm90 finds the row to corrupt, gemm_none gives the tokens to compare
        names = [n for n in ("gemm_sm90", "gemm_none") if n not in names] + names
    results = run_all(names, args.jobs, args.timeout)
    for r in results:
        if not r["ok"]:
            print(f"--- {r['case']}: {r['why']}\n{r.get('log_tail', '')}\n")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print(f"{'case':<17} {'result':<6} {'s':>6}  why / note")
    for r in results:
        print(f"{r['case']:<17} {'ok' if r['ok'] else 'FAIL':<6} {r['seconds']:6.1f}  {r['why'] or r.get('note', '')}")
    failed = [r["case"] for r in results if not r["ok"]]
    print(f"switches: {len(results) - len(failed)} of {len(results)} cases passed" + (f"; failed: {failed}" if failed
                                                                                        else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
