"""The whole pytest suite on a GPU machine, surviving crashes: a test that kills the interpreter (a segfault, an
abort, a CUDA context lost to an illegal address) is recorded as CRASHED with its node id, and pytest starts again on
the tests not yet run. Prints the counts, every failure and crash, and the skip reasons grouped, last; exits 1 when
anything failed or crashed, or when a test skipped for a reason a GPU run must not have (no extension, no vLLM, a
kernel missing from the build), so a degraded machine cannot pass as green.

    python dev/device/suite.py [--json OUT] [--max-restarts N] [--jobs J] [pytest args, default: tests]

--jobs J runs the test files in J pytest processes at once (files dealt out by size, each process's output in
suite_<i>.log beside --json): the GPU tests are small kernels and host work, so they share the GPU well and the
suite takes a fraction of its serial time.

Skips that are fine on an SM90 machine built for 8.9;9.0a: other archs' hardware (SM89, SM120), a forced row's
precondition, CPU-only tests. Everything else is listed as unexpected.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

# Skip reasons a full GPU run on the H200 may have (regular expressions, searched).
ALLOWED_SKIPS = (
    r"SM120|sm_120a|12\.0a",              # Blackwell GeForce hardware or build
    r"SM89 GPU|SM89 and SM90 only",       # Ada hardware
    r"does not take|cannot run|is not in this build's table|no second gemv row",  # a row's precondition
    r"CPU only|tables are not empty|GPU machines check the compiled kernel",  # CPU-side tests on a GPU machine
    r"window at N >= 8192",               # an SM-count-dependent shape
    r"not in this checkout",
    # Peers, not our kernels: the offline vLLM bundle carries no DeepGEMM, and FlashInfer (.fi) travels in a call of
    # its own (with the bundle it passes the 64 MiB carry). The benchmarks say which peers ran.
    r"is_deep_gemm_supported\(\) is False|flashinfer not importable",
)

PLUGIN = '''
import json, os
_LOG = os.environ["BLOCKFP8_SUITE_LOG"]
_DONE = set(json.load(open(os.environ["BLOCKFP8_SUITE_DONE"])))

def pytest_collection_modifyitems(session, config, items):
    keep = [i for i in items if i.nodeid not in _DONE]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i.nodeid in _DONE])
        items[:] = keep

def _write(rec):
    with open(_LOG, "a") as f:
        f.write(json.dumps(rec) + "\\n")
        f.flush()
        os.fsync(f.fileno())

def pytest_runtest_logstart(nodeid, location):
    _write({"event": "start", "nodeid": nodeid})

def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        reason = ""
        if report.skipped and isinstance(report.longrepr, tuple):
            reason = str(report.longrepr[2])
        elif report.failed:  # the end of the traceback: the assertion and its message
            reason = "\\n".join(str(report.longreprtext).strip().splitlines()[-25:])[-3000:]
        _write({"event": "report", "nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
                "reason": reason, "duration": round(report.duration, 3)})
'''


def run(pytest_args: list, max_restarts: int, stdout=None, env_extra=None) -> dict:
    work = Path(tempfile.mkdtemp(prefix="suite_"))
    (work / "blockfp8_suite_plugin.py").write_text(PLUGIN)
    log, done_file = work / "log.jsonl", work / "done.json"
    results: dict = {}  # nodeid -> {"outcome", "reason", "when"}
    crashed: list = []
    restarts = 0
    t0 = time.time()
    while True:
        done_file.write_text(json.dumps(sorted(results)))
        log.write_text("")
        env = dict(os.environ, **(env_extra or {}), BLOCKFP8_SUITE_LOG=str(log), BLOCKFP8_SUITE_DONE=str(done_file),
                   PYTHONPATH=f"{work}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        cmd = [sys.executable, "-X", "faulthandler", "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "-p", "blockfp8_suite_plugin", *pytest_args]
        print(f"suite: {' '.join(cmd[3:])} ({len(results)} done before)", file=stdout or sys.stdout, flush=True)
        rc = subprocess.call(cmd, env=env, stdout=stdout, stderr=subprocess.STDOUT if stdout else None)
        started = None
        for line in log.read_text().splitlines():
            rec = json.loads(line)
            if rec["event"] == "start":
                started = rec["nodeid"]
                continue
            prev = results.get(rec["nodeid"])
            # One record per test: a failing setup/teardown or the call's outcome, whichever is worst.
            if prev is None or prev["outcome"] == "passed" or rec["outcome"] == "failed":
                results[rec["nodeid"]] = {k: rec[k] for k in ("outcome", "reason", "when")}
            if rec["nodeid"] == started and rec["when"] == "teardown":
                started = None
        if rc in (0, 1, 5):  # pytest finished (5: nothing left to collect)
            failed = any(r["outcome"] in ("failed", "crashed") for r in results.values())
            if (rc == 1 and not failed) or not results:  # a failure no test reported (collection, a plugin)
                results[f"<pytest exit {rc}>"] = {"outcome": "failed", "when": "session",
                                                  "reason": "pytest failed outside any test, or ran none"}
            break
        if started is None:  # died outside any test (collection, session teardown)
            print(f"suite: pytest exited {rc} with no test in flight", file=stdout or sys.stdout, flush=True)
            results[f"<pytest exit {rc}>"] = {"outcome": "crashed", "reason": f"rc {rc}", "when": "session"}
            break
        print(f"suite: CRASHED in {started} (pytest exit {rc})", file=stdout or sys.stdout, flush=True)
        crashed.append(started)
        results[started] = {"outcome": "crashed", "reason": f"interpreter died (exit {rc})", "when": "call"}
        restarts += 1
        if restarts > max_restarts:
            results["<restarts exhausted>"] = {"outcome": "crashed", "reason": f"> {max_restarts} crashes",
                                               "when": "session"}
            break
    return {"results": results, "crashed": crashed, "wall_s": round(time.time() - t0, 1)}


def summarize(out: dict) -> int:
    results = out["results"]
    counts = Counter(r["outcome"] for r in results.values())
    skips = Counter(r["reason"] for r in results.values() if r["outcome"] == "skipped")
    unexpected = {why: n for why, n in skips.items() if not any(re.search(p, why) for p in ALLOWED_SKIPS)}
    bad = [(nid, r) for nid, r in results.items() if r["outcome"] in ("failed", "crashed")]
    for nid, r in sorted(bad):
        print(f"{r['outcome'].upper():8} {nid} [{r['when']}] {r['reason'].splitlines()[-1] if r['reason'] else ''}")
    for nid, r in sorted(bad)[:8]:  # the first failures in full (the JSON has every one)
        if r["outcome"] == "failed":
            print(f"---- {nid}\n{r['reason']}")
    print("skip reasons (count, reason):")
    for why, n in skips.most_common():
        print(f"  {n:5}  {'UNEXPECTED ' if why in unexpected else ''}{why[:160]}")
    print(f"suite: {counts.get('passed', 0)} passed, {counts.get('failed', 0)} failed, "
          f"{counts.get('crashed', 0)} crashed, {counts.get('skipped', 0)} skipped "
          f"({sum(unexpected.values())} for an unexpected reason) in {out['wall_s']} s")
    return 1 if bad or unexpected else 0


def run_parallel(files: list, jobs: int, max_restarts: int, log_dir: Path) -> dict:
    """run() over `jobs` groups of files at once (largest files first, each to the group with the fewest bytes)."""
    groups: list = [[] for _ in range(jobs)]
    sizes = [0] * jobs
    for f in sorted(files, key=lambda f: -Path(f).stat().st_size):
        i = sizes.index(min(sizes))
        groups[i].append(f)
        sizes[i] += Path(f).stat().st_size
    outs: list = [None] * jobs
    t0 = time.time()
    # The cores shared out: J processes of torch's default thread count each (all cores) thrash the CPU-side
    # references (seen on the H200 machine: 6 processes took longer than one).
    per_job = str(max(1, (os.cpu_count() or 1) // jobs))

    def one(i: int) -> None:
        with open(log_dir / f"suite_{i}.log", "w") as log:
            outs[i] = run(groups[i], max_restarts, stdout=log,
                          env_extra={"OMP_NUM_THREADS": per_job, "MKL_NUM_THREADS": per_job})

    threads = [threading.Thread(target=one, args=(i,)) for i in range(jobs) if groups[i]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    merged = {"results": {}, "crashed": [], "wall_s": round(time.time() - t0, 1)}
    for i, out in enumerate(outs):
        if out is None and groups[i]:  # the group's runner itself broke: nothing it ran can count
            merged["results"][f"<group {i}: {' '.join(groups[i])}>"] = {"outcome": "crashed", "when": "session",
                                                                     "reason": "the group's runner raised"}
        elif out:
            merged["results"].update(out["results"])
            merged["crashed"] += out["crashed"]
    return merged


def main(argv: list) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write every test's outcome here")
    parser.add_argument("--max-restarts", type=int, default=6)
    parser.add_argument("--jobs", type=int, default=1)
    args, rest = parser.parse_known_args(argv)
    files = rest or ["tests"]
    if args.jobs > 1 and all(Path(f).is_file() for f in files):
        log_dir = Path(args.json).parent if args.json else Path(tempfile.mkdtemp(prefix="suite_logs_"))
        out = run_parallel(files, args.jobs, args.max_restarts, log_dir)
    else:
        out = run(files, args.max_restarts)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return summarize(out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
