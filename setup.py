"""Build of the one extension ``vllm_blockfp8._C`` (PyTorch stable ABI, abi3).

* Generic kernels (quantizer, FP8 GEMV, NVFP4 GEMV and W4A16 GEMM) are compiled for every arch in TORCH_CUDA_ARCH_LIST
  (default ``8.9;9.0a;12.0a``), plus PTX of the lowest arch so newer GPUs can JIT them.
* Arch-specific kernels (``csrc/gemm/sm90/``: CUTLASS wgmma; ``csrc/gemm/sm120/``: CUTLASS's SM120 blockwise
  collective) are compiled only for their arch, by this
  file, with at most BLOCKFP8_ARCH_JOBS (default 2) nvcc processes at once: each CUTLASS translation
  unit takes ~2.5 min and 4-5 GB on 2 cores. One unit per CUTLASS row is generated here, at build
  time, from the arch's one row list (``gemm/<arch>/table.h``); nothing is compiled at run time.
* Without nvcc the package installs as pure Python (the reference backend serves every op).
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).parent.resolve()
CSRC = Path("vllm_blockfp8") / "csrc"
DEFAULT_ARCHS = "8.9;9.0a;12.0a"
# Arch-specific code, compiled only when its arch is in the list:
#   table        the arch's one row list; each row whose kernel is `generate` gets a generated unit that
#                includes `unit_header` and expands `unit_macro("<row name>")` (one unit per row so that
#                the build compiles the rows in parallel; the unit is named after the row, as its ptxas log)
#   kernels      hand-written kernel units of the arch (a glob, or a list of globs)
#   also_for     further archs the units are compiled for (gencode), where those are in the arch list too: the SM89
#                mma.sync rows run on sm_90a as well, so the H200 tests them as forced rows (BLOCKFP8_GEMM_TABLE=sm89)
#   host         host-only files of the arch (compiled into the extension with the generic host files)
#   define       macros set for every file when the arch is built (a list)
#   unit_flags   flags for the arch's own units only. CUTLASS_GDC_ENABLED turns CUTLASS's grid-dependency
#                control on in the SM90 kernels (griddepcontrol.wait before the producers' first global read),
#                which programmatic dependent launch needs; cutlass_gemm.cuh adds the scale-copy warp's wait.
#                Not CUTLASS_ENABLE_GDC_FOR_SM90, which also adds the consumers' trigger: with it CUTLASS 4.2's
#                stream-K scheduler does not compile (its const is_last_tile binds a member to a non-const
#                reference).
ARCHS = {
    "8.9": {
        "kernels": "gemm/sm89/*.cu",
        "host": ["gemm/sm89/plan.cpp"],
        "define": ["BLOCKFP8_HAS_SM89_GEMM"],
        "also_for": ["9.0a"],
    },
    "9.0a": {
        "table": "gemm/sm90/table.h",
        "generate": "cutlass_kernel",
        "unit_header": "gemm/sm90/kernels/cutlass_gemm.cuh",
        "unit_macro": "BLOCKFP8_SM90_ROW_UNIT",
        "kernels": ["gemm/sm90/kernels/*.cu", "fp4/sm90/*.cu"],
        "host": ["gemm/sm90/plan.cpp", "gemm/sm90/dispatch.cpp"],
        "define": ["BLOCKFP8_HAS_SM90_GEMM"],
        "unit_flags": ["-DCUTLASS_GDC_ENABLED"],
    },
    # SM120 (RTX 5090, RTX PRO 6000), compile-checked only: the W8A8 GEMM through CUTLASS 4.2's SM120 blockwise-scaled
    # collective, one unit per row of gemm/sm120/table.h (gemm/sm120/NOTES.md), and the native NVFP4 x NVFP4 GEMM
    # (fp4/sm120/: hand-written units, one per tile; its table is fp4/sm120/table.cpp, compiled in every build).
    "12.0a": {
        "table": "gemm/sm120/table.h",
        "generate": "cutlass_kernel",
        "unit_header": "gemm/sm120/kernels/cutlass_gemm.cuh",
        "unit_macro": "BLOCKFP8_SM120_ROW_UNIT",
        "kernels": ["gemm/sm120/kernels/*.cu", "fp4/sm120/*.cu"],
        "host": ["gemm/sm120/plan.cpp", "gemm/sm120/dispatch.cpp"],
        "define": ["BLOCKFP8_HAS_SM120_GEMM", "BLOCKFP8_HAS_SM120_NVFP4"],
        "unit_flags": [],
    },
}
# TORCH_TARGET_VERSION 2.11: use only stable-ABI calls that torch 2.11 provides, so this build
# loads on every later torch too.
STABLE_ABI_FLAGS = ["-DTORCH_TARGET_VERSION=0x020b000000000000", "-DUSE_CUDA"]


def _as_list(value) -> list:
    return [value] if isinstance(value, str) else list(value)


def _say(msg: str) -> None:
    print(f"vllm_blockfp8: {msg}", file=sys.stderr)


def _cuda_home():
    # torch derives CUDA_HOME from the nvcc on PATH; where that is a wrapper script outside the
    # toolkit (/usr/local/bin/nvcc), point it at the toolkit so its headers are found.
    if "CUDA_HOME" not in os.environ and "CUDA_PATH" not in os.environ:
        nvcc = shutil.which("nvcc")
        for cand in ([Path(nvcc).resolve().parent.parent] if nvcc else []) + [Path("/usr/local/cuda")]:
            if (cand / "bin" / "nvcc").exists() and (cand / "include" / "cuda_runtime_api.h").exists():
                os.environ["CUDA_HOME"] = str(cand)
                break
    try:
        from torch.utils.cpp_extension import CUDA_HOME
    except ImportError:
        return None
    if CUDA_HOME and Path(CUDA_HOME, "bin", "nvcc").exists():
        return CUDA_HOME
    return None


def _source_hash(archs: list[str]) -> str:
    """A hash of every compiled source and the arch list (build_info's build_hash): a `blockfp8 tune` file
    measured on another build is stale."""
    h = hashlib.sha256(";".join(archs).encode())
    for path in sorted(p for ext in ("cu", "cuh", "cpp", "h") for p in (ROOT / CSRC).rglob(f"*.{ext}")):
        h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _gencode(arch: str, ptx: bool = False) -> list[str]:
    num = arch.replace(".", "")
    flags = [f"-gencode=arch=compute_{num},code=sm_{num}"]
    if ptx:
        flags.append(f"-gencode=arch=compute_{num},code=compute_{num}")
    return flags


def _table_rows(table: Path) -> list[tuple[str, str]]:
    """(row name, kernel kind) of each row of an arch's row list, in table order: a row opens with
    `{kRowId, {"name", ...` and names its kernel by a builder call `<kind>()` on a line of its own."""
    text = table.read_text()
    names = re.findall(r'^\s*\{k\w+,\s*\{"(\w+)"', text, re.M)
    kinds = re.findall(r"^\s+(\w+_kernel)\(\)", text, re.M)
    if not names or len(names) != len(kinds):
        raise RuntimeError(f"{table}: could not read the row list ({len(names)} names, {len(kinds)} kernels)")
    return list(zip(names, kinds))


def _generate_units(arch: str, out_dir: Path) -> list[str]:
    """One unit per generated row of the arch's table (rewritten only when its text changes, so an unchanged
    unit keeps its object)."""
    spec = ARCHS[arch]
    if "table" not in spec:  # hand-written units only
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    units = []
    for name, kind in _table_rows(ROOT / CSRC / spec["table"]):
        if kind != spec["generate"]:
            continue
        unit = out_dir / f"{name}.cu"
        text = (f"// Generated by setup.py from {spec['table']} (row {name}); not part of the source tree.\n"
                f'#include "{spec["unit_header"]}"\n\n{spec["unit_macro"]}("{name}")\n')
        if not unit.exists() or unit.read_text() != text:
            unit.write_text(text)
        units.append(str(unit))
    return units


def _newest_dependency(deps: Path, fallback: float) -> float:
    """The newest mtime among the files nvcc's dependency file (-MD) lists for a unit; `fallback` (the newest header
    under csrc) when there is none yet. A listed file that is gone counts as new: the unit is rebuilt."""
    if not deps.exists():
        return fallback
    text = deps.read_text().replace("\\\n", " ")
    files = [f for f in text.partition(":")[2].split() if f]
    try:
        return max((Path(f).stat().st_mtime for f in files), default=fallback)
    except OSError:
        return float("inf")


def _cutlass_include() -> str:
    import importlib.util

    # Found without importing the package (its Python side pulls in cuda-python and more).
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the build needs nvidia-cutlass==4.2.0.0 (CUTLASS C++ headers): pip install it first")
    inc = Path(list(spec.submodule_search_locations)[0]) / "source" / "include"
    if not inc.is_dir():
        raise RuntimeError(f"nvidia-cutlass is installed but {inc} is missing")
    return str(inc)


def _ext_modules():
    if os.environ.get("BLOCKFP8_NO_CUDA", "0") == "1":
        _say("BLOCKFP8_NO_CUDA=1: installing pure Python (reference backend only)")
        return [], {}
    cuda_home = _cuda_home()
    if cuda_home is None:
        _say("nvcc not found: installing pure Python (reference backend only)")
        return [], {}
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    archs = [a.strip() for a in os.environ.get("TORCH_CUDA_ARCH_LIST", DEFAULT_ARCHS).replace(" ", ";").split(";")
             if a.strip()]
    built = [a for a in ARCHS if a in archs]
    defines = [f"-D{d}" for a in built for d in ARCHS[a]["define"]]
    generic = ([str(CSRC / "quant" / "quant.cu")] + sorted(glob.glob(str(CSRC / "gemv" / "*.cu")))
               + sorted(glob.glob(str(CSRC / "fp4" / "*.cu"))) + [str(CSRC / "gemm" / "reference_kernel.cu"),
                                                             str(CSRC / "common" / "check_kernels.cu")])
    # options.cpp in every build: the quantizer follows the SM90 launch mode wherever it runs.
    host = [str(CSRC / f) for f in ("ops.cpp", "host_queries.cpp", "common/overrides.cpp", "linear/linear.cpp",
                                    "gemm/gemm.cpp", "gemm/first_use.cpp", "gemm/sm90/options.cpp",
                                    "common/first_use.cpp", "fp4/sm120/table.cpp", "fp4/first_use.cpp")]
    host += [str(CSRC / f) for a in built for f in ARCHS[a]["host"]]
    nvcc_common = ["-O3", "-std=c++17", "-DNDEBUG", "--expt-relaxed-constexpr", "-lineinfo"]
    generic_gencode = []
    for i, arch in enumerate(sorted(archs, key=lambda a: float(a.rstrip("a")))):
        generic_gencode += _gencode(arch, ptx=(i == 0))

    class Build(BuildExtension):
        """Compiles the arch-specific units first (bounded parallelism), then the extension."""

        def build_extensions(self):
            prebuilt = os.environ.get("BLOCKFP8_PREBUILT_EXT")
            if prebuilt:  # package an extension built before (CI: the editable install's) instead of compiling
                for ext in self.extensions:
                    dst = Path(self.get_ext_fullpath(ext.name))
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(prebuilt, dst)
                    _say(f"BLOCKFP8_PREBUILT_EXT: packaging {prebuilt} as {dst}; nothing compiled")
                return
            os.environ["TORCH_CUDA_ARCH_LIST"] = ";".join(archs)
            objects = self._compile_arch_units(Path(self.build_temp) / "arch_units")
            generated = Path(self.build_temp) / "generated"
            generated.mkdir(parents=True, exist_ok=True)
            # A header, not a -D flag: the arch list holds ';', which the build shell would split on.
            header = generated / "blockfp8_build.h"
            text = (f'#define BLOCKFP8_ARCHS "{";".join(archs)}"\n'
                    f'#define BLOCKFP8_BUILD_HASH "{_source_hash(archs)}"\n')
            if not header.exists() or header.read_text() != text:  # unchanged: its includers keep their objects
                header.write_text(text)
            for ext in self.extensions:
                ext.extra_objects = list(ext.extra_objects or []) + objects
                ext.include_dirs.append(str(generated.resolve()))
            # torch's own build prints nothing per file unless `pip install -v`; say what the silence is.
            jobs = os.environ.get("MAX_JOBS", "all cores")
            _say(f"compiling the generic extension next: {len(generic)} CUDA units x {len(archs)} arch(s) and "
                 f"{len(host)} host files, {jobs} job(s) at a time; roughly 5-10 min per arch on 2 cores "
                 "(pip install -v shows each nvcc command)")
            start = time.monotonic()
            super().build_extensions()
            _say(f"built the generic extension in {time.monotonic() - start:.0f} s")

        def _compile_arch_units(self, out_dir: Path) -> list[str]:
            out_dir.mkdir(parents=True, exist_ok=True)
            nvcc = str(Path(cuda_home) / "bin" / "nvcc")
            headers = [Path(p) for ext in ("h", "cuh") for p in glob.glob(str(ROOT / CSRC / "**" / f"*.{ext}"), recursive=True)]
            newest_header = max((h.stat().st_mtime for h in headers), default=0.0)
            jobs = []
            for arch in built:
                units = _generate_units(arch, Path(self.build_temp) / "generated_units" / arch.replace(".", ""))
                units += [u for pattern in _as_list(ARCHS[arch]["kernels"])
                          for u in sorted(glob.glob(str(ROOT / CSRC / pattern)))]
                for src in units:
                    obj = out_dir / (Path(src).stem + f".sm{arch.replace('.', '')}.o")
                    gencode = [f for a in [arch] + [x for x in ARCHS[arch].get("also_for", []) if x in archs]
                               for f in _gencode(a)]
                    deps = obj.with_suffix(".d")
                    cmd = [nvcc, "-c", str(Path(src).resolve()), "-o", str(obj), *nvcc_common, *gencode,
                           "-Xcompiler", "-fPIC", "-I", _cutlass_include(), "-I", str(ROOT / CSRC),
                           "-Xptxas", "-v", *defines, *ARCHS[arch].get("unit_flags", []), "-MD", "-MF", str(deps)]
                    fresh = obj.exists() and obj.stat().st_mtime > max(Path(src).stat().st_mtime,
                                                                        _newest_dependency(deps, newest_header))
                    jobs.append((src, obj, cmd, fresh))
            todo = [j for j in jobs if not j[3]]
            parallel = max(1, int(os.environ.get("BLOCKFP8_ARCH_JOBS", "2")))
            if todo:
                _say(f"compiling {len(todo)} arch-specific unit(s), {parallel} at a time (each ~2-3 min and "
                     "4-5 GB on 2 cores)")
            done = iter(range(1, len(todo) + 1))  # next() under the GIL: each finished unit takes one number

            def run(job):
                src, obj, cmd, _ = job
                start = time.monotonic()
                proc = subprocess.run(cmd, capture_output=True, text=True)
                log = obj.with_suffix(".log")
                log.write_text(proc.stdout + proc.stderr)
                if proc.returncode != 0:
                    raise RuntimeError(f"nvcc failed on {src}:\n{proc.stderr[-6000:]}")
                _say(f"[{next(done)}/{len(todo)}] built {Path(src).name} in {time.monotonic() - start:.0f} s "
                     f"({log} has the ptxas report)")
                # The spill summary in the build output itself (CI checks it: an editable build's logs are temporary).
                spills = [(int(st), int(ld)) for st, ld in
                          re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", proc.stdout + proc.stderr)]
                if spills:
                    _say(f"ptxas {obj.stem}: {len(spills)} kernel(s), most spill stores {max(s for s, _ in spills)} "
                         f"bytes, most spill loads {max(l for _, l in spills)} bytes")

            with ThreadPoolExecutor(parallel) as pool:
                list(pool.map(run, todo))
            return [str(j[1]) for j in jobs]

    ext = CUDAExtension(
        name="vllm_blockfp8._C",
        sources=host + generic,
        include_dirs=[str(ROOT / CSRC)],
        extra_compile_args={
            "cxx": ["-O3", "-std=c++17", *STABLE_ABI_FLAGS, *defines],
            "nvcc": [*nvcc_common, *generic_gencode, *defines],
        },
        py_limited_api=True,
    )
    return [ext], {"build_ext": Build}


ext_modules, cmdclass = _ext_modules()
setup(
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    options={"bdist_wheel": {"py_limited_api": "cp310"}} if ext_modules else {},
)
