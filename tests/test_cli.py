"""The ``blockfp8`` console script (vllm_blockfp8/cli.py): help, info, quantize, bench, demo. CPU only."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import vllm_blockfp8
from vllm_blockfp8 import cli, library, ops

SUBCOMMANDS = ("quantize", "info", "bench", "tune", "demo")
CHECKOUT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("argv", [[], *([c] for c in SUBCOMMANDS)])
def test_help(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([*argv, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: blockfp8 {' '.join(argv)}".rstrip())
    if not argv:
        assert all(c in out for c in SUBCOMMANDS)


def test_module_entry_point():
    res = subprocess.run([sys.executable, "-m", "vllm_blockfp8", "quantize", "--help"], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0 and "--format {fp8-block,nvfp4}" in res.stdout


def test_usage_errors(capsys):
    for argv in ([], ["quantize", "only-src"], ["info", "--bogus"], ["quantize", "a", "b", "--format", "int4"]):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 2
    assert "usage: blockfp8" in capsys.readouterr().err


def test_formats_match_the_tool():
    from vllm_blockfp8.tools.quantize import FORMATS

    assert cli.QUANT_FORMATS == FORMATS


def test_info_text(capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "vllm_blockfp8" in out and "torch" in out and "tile table gemv" in out
    if torch.cuda.is_available():
        assert "compute capability" in out
    else:
        assert "no CUDA GPU" in out


def test_info_json(capsys):
    assert cli.main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert {"vllm_blockfp8", "vllm", "torch", "torch_cuda", "gpu", "extension", "tile_tables"} <= set(info)
    families = {"linear", "gemv", "gemm", "quant", "nvfp4", "nvfp4_native"}
    # Without a GPU the GEMM table of the GPU is unknown, so each built arch's table is listed instead.
    by_arch = {f"gemm ({t})": ops.gemm_table_rows(t) for t in ("sm89", "sm90", "sm120")} \
        if ops.HAS_CUDA_KERNELS and not torch.cuda.is_available() else {}
    assert set(info["tile_tables"]) == families | {k for k, rows in by_arch.items() if rows}
    for key, rows in by_arch.items():
        assert info["tile_tables"].get(key, []) == rows
    if not torch.cuda.is_available():
        assert info["gpu"] is None
        assert all(v == [] for f, v in info["tile_tables"].items() if f in families - {"quant", "nvfp4_native"})
    # The SM120 native NVFP4 rows depend on the build only (listed without a GPU).
    assert info["tile_tables"]["nvfp4_native"] == ops.nvfp4_native_rows()
    # The quant table is the same on every arch: listed whenever the extension is built.
    names = [r["name"] for r in info["tile_tables"]["quant"]]
    assert names == ([r["name"] for r in ops.tile_table("quant")] if ops.HAS_CUDA_KERNELS else [])


def test_info_survives_broken_ops(monkeypatch, capsys):
    broken = types.ModuleType("vllm_blockfp8.ops")

    def boom(*args):
        raise RuntimeError("extension exploded")

    broken.build_info = broken.tile_table = boom
    monkeypatch.setitem(sys.modules, "vllm_blockfp8.ops", broken)
    monkeypatch.setattr(vllm_blockfp8, "ops", broken, raising=False)
    assert cli.main(["info"]) == 0
    assert "extension exploded" in capsys.readouterr().out


def test_info_tells_no_gpu_from_no_extension(monkeypatch):
    from vllm_blockfp8.tools import info

    base = {"vllm_blockfp8": "0", "vllm": "0", "torch": "0", "torch_cuda": None, "gpu": None,
            "tile_tables": {"gemv": [], "quant": []}}
    no_gpu = info.render({**base, "extension": {"compiled": True, "archs": ["9.0a"], "families": {}},
                          "kernels_unavailable": "no CUDA GPU is visible"})
    assert "cannot run: no CUDA GPU is visible" in no_gpu and "compiled and loaded" in no_gpu
    assert "tile table gemv: empty (no CUDA GPU" in no_gpu and "extension" not in no_gpu.split("tile table")[1]
    no_ext = info.render({**base, "gpu": {"name": "H200", "count": 1, "capability": "9.0", "sm": "sm_90"},
                          "extension": {"compiled": False, "archs": [], "families": {}},
                          "kernels_unavailable": "the compiled extension vllm_blockfp8._C is not loaded (x)"})
    assert "no CUDA GPU" not in no_ext and "tile table gemv: empty (no compiled extension)" in no_ext
    # The reason itself names each missing piece and only those.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(library, "HAS_CUDA_KERNELS", True)
    assert library.kernels_unavailable_reason() == "no CUDA GPU is visible"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 9))
    assert library.kernels_unavailable_reason() is None
    assert library.kernels_unavailable_reason(capability=(9, 0)) == "the GPU is SM89, this needs SM90"
    monkeypatch.setattr(library, "HAS_CUDA_KERNELS", False)
    assert library.kernels_unavailable_reason().startswith("the compiled extension vllm_blockfp8._C is not loaded")


def test_quantize_refuses_bad_path_before_torch(tmp_path):
    code = ("import sys; from vllm_blockfp8 import cli; rc = cli.main(['quantize', sys.argv[1], sys.argv[2]]); "
            "print(rc, 'torch' in sys.modules)")
    for src in (tmp_path / "missing", tmp_path):  # no directory; a directory without config.json
        proc = subprocess.run([sys.executable, "-c", code, str(src), str(tmp_path / "dst")], capture_output=True,
                              text=True, timeout=120)
        assert proc.stdout.split() == ["2", "False"], proc.stdout + proc.stderr
        assert "error: SRC" in proc.stderr


def _tiny_checkpoint(path):
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (path / "tokenizer_config.json").write_text("{}")
    gen = torch.Generator().manual_seed(0)
    save_file({"model.layers.0.mlp.down_proj.weight": torch.randn(128, 256, generator=gen).to(torch.bfloat16),
               "model.embed_tokens.weight": torch.randn(64, 128, generator=gen).to(torch.bfloat16)},
              str(path / "model.safetensors"))
    return path


def test_quantize_command(tmp_path, capsys):
    src, dst = _tiny_checkpoint(tmp_path / "src"), tmp_path / "dst"
    assert cli.main(["quantize", str(src), str(dst), "--no-progress", "--ignore", "model.embed_tokens"]) == 0
    out = capsys.readouterr().out
    assert "worst rms_rel" in out and "1 weights quantized to fp8-block" in out
    assert (dst / "quantization_report.json").is_file() and (dst / "tokenizer_config.json").is_file()
    # Refusals are one line on stderr, exit status 2, and write nothing.
    assert cli.main(["quantize", str(src), str(dst), "--no-progress"]) == 2
    assert "error: DST" in capsys.readouterr().err
    assert cli.main(["quantize", str(tmp_path / "missing"), str(tmp_path / "d2"), "--format", "nvfp4"]) == 2
    assert "not a directory" in capsys.readouterr().err and not (tmp_path / "d2").exists()


def test_bench_without_benchmarks_dir(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(cli, "benchmarks_dir", lambda: tmp_path / "absent")
    assert cli.main(["bench", "--op", "gemv"]) == 2
    assert "source checkout" in capsys.readouterr().err


@pytest.fixture
def fresh_benchmarks_package():
    """Each test imports `benchmarks` from its own directory: forget any copy imported before."""
    def ours(name):
        return name == "benchmarks" or name.startswith("benchmarks.")

    saved = {k: v for k, v in sys.modules.items() if ours(k)}
    for k in saved:
        del sys.modules[k]
    yield
    for k in [k for k in sys.modules if ours(k)]:
        del sys.modules[k]
    sys.modules.update(saved)


def _fake_benchmarks(tmp_path):
    """benchmarks/ as a package whose scripts import a sibling relatively, like the real ones."""
    root = tmp_path / "benchmarks"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "harness.py").write_text(f"LOG = {str(root / 'calls.jsonl')!r}\n")
    for stem in ("bench_gemv", "bench_gemm"):
        (root / f"{stem}.py").write_text(
            "import json\nfrom . import harness\n"
            f"def main(argv):\n    open(harness.LOG, 'a').write(json.dumps(['{stem}', argv]) + '\\n')\n"
            "    return 0\n")
    return root


def test_bench_without_gpu(monkeypatch, tmp_path, capsys, fresh_benchmarks_package):
    monkeypatch.setattr(cli, "benchmarks_dir", lambda: _fake_benchmarks(tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["bench"]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err


def test_bench_runs_scripts_with_arguments(monkeypatch, tmp_path, fresh_benchmarks_package):
    root = _fake_benchmarks(tmp_path)
    monkeypatch.setattr(cli, "benchmarks_dir", lambda: root)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cli.main(["bench", "--op", "linear", "--shapes", "qwen3-8b.o", "dsv3", "--m", "1", "16", "--json",
                     "r.json", "--quick", "--", "--rows"]) == 0
    assert cli.main(["bench", "--json", "out/r.json", "--plot", "p.png"]) == 0
    calls = [json.loads(line) for line in (root / "calls.jsonl").read_text().splitlines()]
    assert calls == [
        ["bench_gemm", ["--ops", "linear", "--shapes", "qwen3-8b.o,dsv3", "--m", "1,16", "--json", "r.json",
                        "--quick", "--rows"]],
        ["bench_gemv", ["--json", "out/r.gemv.json", "--plot", "p.gemv.png"]],
        ["bench_gemm", ["--json", "out/r.gemm.json", "--plot", "p.gemm.png"]],
    ]
    assert cli.main(["bench", "--op", "quant"]) == 2  # its script is absent here


@pytest.fixture
def checkout_benchmarks(monkeypatch):
    """This checkout's benchmarks/: where `blockfp8 bench` looks when the package runs from the checkout
    (checked); with the package installed from a wheel (CI's second venv) it is pointed there."""
    if Path(vllm_blockfp8.__file__).resolve().parents[1] == CHECKOUT:
        assert cli.benchmarks_dir() == CHECKOUT / "benchmarks"
    else:
        monkeypatch.setattr(cli, "benchmarks_dir", lambda: CHECKOUT / "benchmarks")


def test_bench_dry_run_of_the_real_script(tmp_path, fresh_benchmarks_package, checkout_benchmarks):
    """--dry-run needs no GPU: the repository's bench_quant runs its table/JSON code on fake timings."""
    if not (cli.benchmarks_dir() / "bench_quant.py").is_file():
        pytest.skip("benchmarks/bench_quant.py not in this checkout")
    out, plot = tmp_path / "quant.json", tmp_path / "quant.png"
    assert cli.main(["bench", "--op", "quant", "--quick", "--dry-run", "--m", "1", "1024", "--json", str(out),
                     "--plot", str(plot), "--", "--peers", "none"]) == 0
    assert out.is_file() and plot.is_file()


def test_bench_nvfp4_is_wired(tmp_path, fresh_benchmarks_package, checkout_benchmarks):
    """`blockfp8 bench --op nvfp4` runs benchmarks/bench_nvfp4.py (and so does a bare `blockfp8 bench`);
    every --op names a script of this checkout. The dry run needs no GPU."""
    assert cli.BENCH_RUNS["nvfp4"] == ("bench_nvfp4", ()) and ("nvfp4", "bench_nvfp4", ()) in cli.BENCH_ALL
    for stem, _ in cli.BENCH_RUNS.values():
        assert (cli.benchmarks_dir() / f"{stem}.py").is_file(), stem
    out, plot = tmp_path / "nvfp4.json", tmp_path / "nvfp4.png"
    assert cli.main(["bench", "--op", "nvfp4", "--quick", "--dry-run", "--m", "1", "4096", "--json", str(out),
                     "--plot", str(plot)]) == 0
    data = json.loads(out.read_text())
    assert data["header"]["script"] == "bench_nvfp4" and data["geomean"]
    assert {(r["op"], r["m"]) for r in data["records"]} == {("nvfp4", 1), ("nvfp4", 4096)}
    assert {r["impl"] for r in data["records"]} == {"ours", "marlin_fp4", "bf16", "yardstick:ours_fp8"}


def test_demo_passes_arguments_through(monkeypatch, tmp_path):
    seen = []
    fake = types.ModuleType("vllm_blockfp8.demo")
    fake.main = lambda args: seen.append(args) or 0
    monkeypatch.setitem(sys.modules, "vllm_blockfp8.demo", fake)
    monkeypatch.setattr(vllm_blockfp8, "demo", fake, raising=False)
    assert cli.main(["demo", "--model-dir", str(tmp_path), "--keep", "--max-tokens", "7",
                     "--attention-backend", "TRITON_ATTN", "--logprobs", "5", "--enforce-eager"]) == 0
    assert cli.main(["demo"]) == 0
    assert (seen[0].model_dir, seen[0].keep, seen[0].max_tokens) == (tmp_path, True, 7)
    assert (seen[0].attention_backend, seen[0].logprobs, seen[0].enforce_eager) == ("TRITON_ATTN", 5, True)
    assert (seen[1].model_dir, seen[1].keep, seen[1].attention_backend) == (None, False, None)
    assert (seen[1].logprobs, seen[1].enforce_eager) == (0, False)
    assert cli.main(["demo", "--logprobs", "-1"]) == 2 and len(seen) == 2


def test_readme_stays_short_and_names_every_subcommand():
    """The README is for users: at most 12,000 characters, every subcommand shown with a command line that runs."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert len(readme) <= 12000, f"README.md is {len(readme)} characters"
    for sub in SUBCOMMANDS:
        assert f"blockfp8 {sub}" in readme, sub
    assert "tune MODEL_DIR --dry-run" in readme  # --dry-run still needs the model's config (its layer shapes)
