"""The flashinfer_blockscale peer (vLLM 0.26's block-FP8 linear at M < 32 on SM90: FlashInfer's
fp8_blockscale_gemm_sm90) and its device scripts: on CPU its skip reason without FlashInfer, the M it
takes, bench_gemv's dry run, the wheel download (a fake pip) and the AOT script's syntax; on an SM90
GPU with FlashInfer, its output against the reference.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import needs_kernels

from benchmarks import bench_gemv, peers, report

ROOT = Path(__file__).resolve().parent.parent
DEVICE = ROOT / "dev" / "device"
PEER = next(p for p in peers.DECODE_PEERS if p.name == "flashinfer_blockscale")


@pytest.fixture
def no_flashinfer(monkeypatch):
    """flashinfer made unimportable (None in sys.modules), the peer's cached import forgotten."""
    peers.flashinfer_gemm.cache_clear()
    for name in ("flashinfer", "flashinfer.gemm"):
        monkeypatch.setitem(sys.modules, name, None)
    yield
    peers.flashinfer_gemm.cache_clear()


def test_peer_skips_with_its_reason_when_flashinfer_is_missing(no_flashinfer, monkeypatch, capsys):
    if not torch.cuda.is_available():
        assert PEER.unavailable() == "no CUDA device"  # asked before the (slow) import
    monkeypatch.setattr(peers, "_needs_cuda", lambda: None)  # as on a GPU machine without FlashInfer
    why = PEER.unavailable()
    assert why.startswith("flashinfer not importable: ") and "flashinfer" in why[len("flashinfer not"):]
    probed = peers.probe([PEER], dry_run=False)
    assert probed[PEER.name] == f"{why} [needs {PEER.needs}]"
    assert "peer flashinfer_blockscale: flashinfer not importable" in capsys.readouterr().out
    # The harness gets the reason as the variant's skip (and records it, never builds the peer).
    (variant,) = peers.variants([PEER], probed, "linear", None, None, 1, 4096, 7168, dry_run=True)
    assert variant.impl == PEER.name and variant.skip == probed[PEER.name]


def test_peer_takes_decode_m_and_flashinfers_n_k_only():
    assert PEER.reference == "w8a8" and PEER in peers.select(peers.DECODE_PEERS, "flashinfer_blockscale")
    for m in (1, 16, 31, 32):
        assert PEER.rejects(m, 4096, 7168) is None
    assert "M < 32" in PEER.rejects(33, 4096, 7168)
    assert "multiple of 64" in PEER.rejects(1, 4096 + 32, 7168)
    assert "multiple of 128" in PEER.rejects(1, 4096, 7168 + 64)
    with pytest.raises(ValueError, match="linear mode"):
        PEER.build(None, "gemm")


def test_bench_gemv_lists_the_peer_beside_the_others(tmp_path, monkeypatch):
    out_json = tmp_path / "g.json"
    monkeypatch.setattr(report.Report, "plot", lambda self, path: "no plot in this test")
    assert bench_gemv.main(["--dry-run", "--shapes", "4096x7168", "--m", "1,16,48", "--peers",
                            "deepgemm,flashinfer_blockscale", "--json", str(out_json)]) == 0
    data = json.loads(out_json.read_text())
    timed = {(r["impl"], r["m"]) for r in data["records"]}
    skipped = {(s["impl"], s["m"]): s["reason"] for s in data["skipped"]}
    for m in (1, 16):
        assert ("flashinfer_blockscale", m) in timed | set(skipped)
    assert "M < 32" in skipped[("flashinfer_blockscale", 48)]


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("git") is None, reason="needs bash and git")
def test_fetch_script_downloads_flashinfer_into_dot_fi(tmp_path):
    """The script run from a copy in a scratch git tree, a fake python3 recording each pip call."""
    tree = tmp_path / "tree"
    (tree / "dev" / "device").mkdir(parents=True)
    shutil.copy(DEVICE / "fetch_device_wheels.sh", tree / "dev" / "device")
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    # Each call is logged; a file per requirement lands in the -d folder.
    fake.write_text('#!/bin/bash\necho "$*" >> "$CALLS"\nd=; prev=\nfor a in "$@"; do\n'
                    '  [ "$prev" = -d ] && d=$a; prev=$a\ndone\n'
                    'for a in "$@"; do case $a in *==*) touch "$d/${a%%==*}.whl" ;; esac; done\n')
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", CALLS=str(log))
    proc = subprocess.run(["bash", "dev/device/fetch_device_wheels.sh", "--flashinfer"], cwd=tree,
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    (fi_call,) = [c for c in log.read_text().splitlines() if "-d .fi" in c]
    for want in ("flashinfer-python==0.6.14", "apache-tvm-ffi==0.1.10", "nvidia-cudnn-frontend==",
                 "cuda-tile==", "--python-version 3.12", "--only-binary=:all:", "manylinux_2_28_x86_64",
                 "--no-deps"):
        assert want in fi_call
    assert (tree / ".fi" / "flashinfer-python.whl").exists()
    assert "/.fi/" in (tree / ".git" / "info" / "exclude").read_text().splitlines()
    bad = subprocess.run(["bash", "dev/device/fetch_device_wheels.sh", "--nope"], cwd=tree, env=env,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "--flashinfer" in bad.stderr


@pytest.mark.parametrize("script", ["fetch_device_wheels.sh", "flashinfer_aot.sh"])
def test_device_scripts_parse(script):
    assert subprocess.run(["bash", "-n", str(DEVICE / script)]).returncode == 0
    text = (DEVICE / script).read_text()
    assert "flashinfer" in text and "/.fi/" in text
    if script == "flashinfer_aot.sh":
        assert "gen_fp8_blockscale_gemm_sm90_module" in text and "soname,libcuda.so.1" in text
        assert ".fi/aot/fp8_blockscale_gemm_90.so" in text and "FLASHINFER_CUDA_ARCH_LIST=9.0a" in text
    else:
        assert "NOT beside the 52 MiB vLLM bundle" in text


@needs_kernels(capability=(9, 0), extension=False)
@pytest.mark.parametrize("m", [1, 16, 31])
def test_peer_output_matches_reference_on_sm90(m):
    if PEER.unavailable():
        pytest.skip(PEER.unavailable())
    n, k = 2048, 7168
    copies = peers.LazyCopies(lambda i: peers.make_operands(m, n, k, gemm_inputs=False))
    out = PEER.build(copies[0], "linear")()
    torch.cuda.synchronize()
    assert out.shape == (m, n) and out.dtype == torch.bfloat16
    assert peers.Checker(copies).linear(PEER.reference)(out) is None
