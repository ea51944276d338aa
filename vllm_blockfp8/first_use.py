"""The first-use check of kernel rows that have never run on their GPU architecture here (the SM89 and SM120 GEMM
tables, SM120's native NVFP4 rows), run in a child process before the serving process uses them.

Each such row checks itself against a reference kernel on first use (csrc/common/first_use.h). In the process that
serves, a wrong result is caught and the row falls back, but a row that faults (an illegal address) would take the
CUDA context, and the server, with it. So at startup (``config._startup_once``) the rows this GPU would check are
run here first, in a child process, one JSON line per row as each finishes; the outcomes are recorded in this
process, where the rows then run (passed) or yield to the safe path (failed) without checking again. A child that
dies or hangs names the row it was on: that row is recorded failed and the child is started again for the rest.

``BLOCKFP8_SELF_CHECK=inprocess`` skips the child: the rows check themselves in this process on first use.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Callable, Optional

TIMEOUT_S = 180  # one child: CUDA start-up, the extension, a handful of small checks
MODE_ENV = "BLOCKFP8_SELF_CHECK"


def _child_command(device: int, rows: list) -> list:
    return [sys.executable, "-m", "vllm_blockfp8.first_use", "--device", str(device), json.dumps(rows)]


def run_child(device: int, rows: list, timeout_s: float) -> tuple[int, str, str]:
    """(return code, stdout, stderr) of one child checking ``rows`` on ``device``; rc -9 on a timeout."""
    try:
        proc = subprocess.run(_child_command(device, rows), capture_output=True, text=True, timeout=timeout_s)
        return proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        return -9, out, err + f"\n(timed out after {timeout_s:.0f} s)"


def _key(row: dict) -> tuple:
    return row["family"], int(row["table"]), int(row["row"])


def check_isolated(rows: list, device: int, record: Callable[[str, int, int, str], object],
                   runner: Callable[[int, list, float], tuple] = run_child, timeout_s: float = TIMEOUT_S) -> dict:
    """Checks ``rows`` ([{"family", "table", "row", "name"}]) in child processes and records each outcome with
    ``record(family, table, row, why)`` (why "" = passed). Returns {name: why}. A child that exits or hangs before
    reporting every row marks the first unreported one failed (the row it was on) and the rest go to a new child;
    so at most one child per row, and every row ends recorded."""
    outcomes: dict = {}
    todo = list(rows)
    while todo:
        rc, out, err = runner(device, todo, timeout_s)
        reported = {}
        for line in out.splitlines():
            try:
                msg = json.loads(line)
                reported[_key(msg)] = str(msg["why"])
            except (ValueError, KeyError, TypeError):
                continue  # not a result line (the child's imports may print)
        left = []
        for row in todo:
            if _key(row) in reported:
                outcomes[row["name"]] = reported[_key(row)]
                record(row["family"], int(row["table"]), int(row["row"]), reported[_key(row)])
            else:
                left.append(row)
        if not left:
            break
        tail = " ".join(err.strip().splitlines()[-2:])[-300:] if err.strip() else "no output"
        why = (f"the check process {'timed out' if rc == -9 else f'exited with {rc}'} while checking this row "
               f"({tail})")
        culprit = left[0]
        outcomes[culprit["name"]] = why
        record(culprit["family"], int(culprit["table"]), int(culprit["row"]), why)
        todo = left[1:]
    return outcomes


_done = False


def ensure_checked(device: Optional[int] = None) -> Optional[dict]:
    """Once per process, on a CUDA GPU: the isolated check of every row this GPU would check before its first run
    (none on an SM90 GPU without BLOCKFP8_SELF_CHECK=always). Returns the outcomes, or None where nothing ran."""
    global _done
    if _done or os.environ.get(MODE_ENV, "") == "inprocess":
        return None
    _done = True
    import torch

    from . import ops

    if ops.kernels_unavailable_reason() is not None:
        return None
    device = torch.cuda.current_device() if device is None else device
    rows = ops.first_use_pending(torch.cuda.get_device_capability(device))
    if not rows:
        return None
    t0 = time.monotonic()
    outcomes = check_isolated(rows, device, ops.first_use_record)
    print(summary_line(outcomes, time.monotonic() - t0), file=sys.stderr, flush=True)
    return outcomes


def summary_line(outcomes: dict, seconds: float) -> str:
    """The one start-up line a server log shows for the check: how many rows, how long, which failed."""
    failed = sorted(name for name, why in outcomes.items() if why)
    tail = f", failed: {', '.join(failed)} (they yield to the safe path)" if failed else ""
    return (f"[blockfp8] first-use check: {len(outcomes)} rows in a child process, "
            f"{len(outcomes) - len(failed)} passed in {seconds:.1f} s{tail}")


def _child_main(argv: list) -> int:
    """The child: checks each row given as JSON on the given device, one JSON line per row, flushed as it finishes
    (so a fault names the row it happened on)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m vllm_blockfp8.first_use")
    ap.add_argument("--device", type=int, required=True)
    ap.add_argument("rows", help="JSON list of {family, table, row, name}")
    args = ap.parse_args(argv)
    import torch

    from . import ops

    torch.cuda.set_device(args.device)
    for row in json.loads(args.rows):
        why = ops.first_use_run(row["family"], int(row["table"]), int(row["row"]))
        print(json.dumps({"family": row["family"], "table": int(row["table"]), "row": int(row["row"]), "why": why}),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
