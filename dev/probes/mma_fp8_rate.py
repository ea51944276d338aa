"""Build and run dev/probes/mma_fp8_rate_probe.cu, then print ONE JSON line: the sustained mma.sync rates that
benchmarks/bench_sm89.py takes as the SM89 rows' compute ceiling (``--mma-peak FILE``).

    python dev/probes/mma_fp8_rate.py --out /tmp/mma_peak.json            # sm_90a (the H200)
    python dev/probes/mma_fp8_rate.py --arch 89 --json full.json          # an Ada GPU

The line: {"probe": "mma_fp8_rate", "gpu", "sms", "arch", "e4m3_tflops", "e4m3_flop_per_clk_sm", "e4m3_clock_ghz",
"bf16_tflops", "bf16_flop_per_clk_sm", "git", "full": path}. On the H200 the e4m3 mma.sync is an f16 emulation
(the probe's header says why), so it is the ceiling of the SM89 rows there, not Ada's FP8 rate. Exits non-zero,
with the reason on stderr, when the build or the run fails or the probe reports no peak: no number is made up.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "mma_fp8_rate_probe.cu"


def build(arch: str, exe: Path) -> None:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise SystemExit("mma_fp8_rate: nvcc not on PATH")
    code = f"sm_{arch}"
    cmd = [nvcc, "-O3", "-std=c++17", f"-gencode=arch=compute_{arch},code={code}", "-Xptxas", "-v",
           str(SOURCE), "-o", str(exe)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise SystemExit(f"mma_fp8_rate: nvcc failed ({proc.returncode}):\n{log}")
    spills = [line for line in log.splitlines() if "spill" in line and " 0 bytes spill stores, 0 bytes spill loads" not in line]
    if spills:  # a spilled probe measures local-memory traffic, not the mma rate
        raise SystemExit("mma_fp8_rate: the probe spills registers:\n" + "\n".join(spills))


def summary(full: dict, arch: str, full_path: Path) -> dict:
    try:
        e4m3, bf16 = full["peak"]["e4m3_m16n8k32"], full["peak"]["bf16_m16n8k16"]
    except (KeyError, TypeError) as exc:
        raise SystemExit(f"mma_fp8_rate: the probe's JSON has no peak ({exc!r})")
    return {"probe": "mma_fp8_rate", "gpu": full.get("gpu"), "sms": full.get("sms"), "arch": f"sm_{arch}",
            "e4m3_tflops": e4m3["tflops"], "e4m3_flop_per_clk_sm": e4m3["flop_per_clk_sm"],
            "e4m3_clock_ghz": e4m3["clock_ghz"], "e4m3_config": f"warps {e4m3['warps']} chains {e4m3['chains']}",
            "bf16_tflops": bf16["tflops"], "bf16_flop_per_clk_sm": bf16["flop_per_clk_sm"],
            "git": full.get("git"), "full": str(full_path)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="90a", help="nvcc arch digits: 90a (H200, default) or 89 (Ada)")
    p.add_argument("--iters", type=int, default=32768, help="mma per chain per warp in the timed launch")
    p.add_argument("--json", type=Path, help="the probe's full JSON (default: a temp file)")
    p.add_argument("--out", type=Path, help="also write the one-line summary here (bench_sm89 --mma-peak reads it)")
    p.add_argument("--exe", type=Path, help="use this built probe instead of compiling")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="mma_probe_"))
    exe = args.exe or work / "mma_fp8_rate_probe"
    if args.exe is None:
        build(args.arch, exe)
    full_path = args.json or work / "mma_fp8_rate_probe.json"
    proc = subprocess.run([str(exe), str(full_path), str(args.iters)], capture_output=True, text=True)
    sys.stderr.write(proc.stdout + proc.stderr)  # the per-configuration table, for the log
    if proc.returncode != 0:
        raise SystemExit(f"mma_fp8_rate: the probe failed ({proc.returncode})")
    line = json.dumps(summary(json.loads(full_path.read_text()), args.arch, full_path))
    print(line, flush=True)
    if args.out:
        args.out.write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
