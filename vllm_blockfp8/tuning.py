"""Tuned row overrides (``blockfp8 tune``): the file, the machine it belongs to, loading it into the ops.

The file (JSON, ``blockfp8_tuned.json`` beside the model, or the path in ``BLOCKFP8_TUNED_CONFIG``)::

    {"version": 1, "key": {"gpu", "capability", "driver", "cuda", "build_hash", "gemm_table"},
     "model": "...", "buckets": [...], "min_gain": 0.03,
     "measurements": [{"family", "n", "k", "m", "m_min", "m_max", "default_row", "times_us": {row: us},
                       "confirm_us": {row: us} (where a win was timed again: the table's row and the winner)}],
     "overrides": [{"family", "n", "k", "m_min", "m_max", "row", "gain"}]}

``overrides`` holds only the measured points where another row beat the table's own choice by at least
``min_gain``; the ops receive them through ``ops.set_tuned_rows`` and consult them inside the op (one graph node).
A file whose key differs from this process's (another GPU, driver, CUDA, build, or GEMM table) or that does not
parse is ignored with one warning naming why: a tuned file can only ever cost its gain, never correctness.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Callable, Optional

logger = logging.getLogger("vllm_blockfp8")

VERSION = 1
FILE_NAME = "blockfp8_tuned.json"
ENV = "BLOCKFP8_TUNED_CONFIG"
MIN_GAIN = 0.03
KEY_FIELDS = ("gpu", "capability", "driver", "cuda", "build_hash", "gemm_table")
_ENTRY_INTS = ("n", "k", "m_min", "m_max")

# What the last load() did, for `blockfp8 info`: {"path", "overrides"} or {"path", "ignored": why}.
STATE: dict = {}
_warned: set = set()


class TunedFileError(ValueError):
    """Why a tuned file cannot be used."""


def _driver_version() -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # no NVML (or no driver): the CUDA driver API version still tells drivers apart roughly
        import torch

        getter = getattr(torch._C, "_cuda_getDriverVersion", None)
        return f"cuda-driver-api {getter()}" if getter else "unknown"


def machine_key() -> Optional[dict]:
    """This process's key (KEY_FIELDS), or None where the kernels cannot run (nothing to tune or override)."""
    import torch

    from . import ops

    if ops.kernels_unavailable_reason() is not None:
        return None
    major, minor = torch.cuda.get_device_capability()
    return {"gpu": torch.cuda.get_device_name(), "capability": f"{major}.{minor}", "driver": _driver_version(),
            "cuda": torch.version.cuda, "build_hash": ops.build_info().get("build_hash", "unknown"),
            "gemm_table": os.environ.get("BLOCKFP8_GEMM_TABLE", "") or "auto"}


def m_ranges(buckets) -> list:
    """(m_min, m_max) each measured bucket stands for: bucket b_i serves b_{i-1} < M <= b_i (the first from M = 1);
    M past the last bucket keeps the table's choice."""
    out, low = [], 1
    for b in sorted(set(int(x) for x in buckets)):
        out.append((low, b))
        low = b + 1
    return out


def select_overrides(measurements, min_gain: float = MIN_GAIN) -> list:
    """The overrides of measured points where the fastest row beats the table's own choice (``default_row``,
    timed as the op chooses it) by ``min_gain`` or more: gain = t_default / t_best - 1. Where the point was timed
    again (``confirm_us``: the two rows alone), the gain is the smaller of the two timings'."""
    out = []
    for p in measurements:
        times = {r: t for r, t in p["times_us"].items() if t is not None and t > 0}
        base = times.get(p["default_row"])
        if not times or base is None:
            continue
        best = min(times, key=times.get)
        gain = base / times[best] - 1.0
        again = p.get("confirm_us") or {}
        if again:
            a_base, a_best = again.get(p["default_row"]), again.get(best)
            gain = min(gain, a_base / a_best - 1.0) if a_base and a_best and a_best > 0 else -1.0
        if best != p["default_row"] and gain >= min_gain:
            out.append({"family": p["family"], "n": p["n"], "k": p["k"], "m_min": p["m_min"], "m_max": p["m_max"],
                        "row": best, "gain": round(gain, 4)})
    return out


def document(key: dict, measurements: list, buckets, model: str = "", min_gain: float = MIN_GAIN) -> dict:
    return {"version": VERSION, "key": dict(key), "model": model, "buckets": list(buckets), "min_gain": min_gain,
            "measurements": list(measurements), "overrides": select_overrides(measurements, min_gain)}


def write(path: Path, doc: dict) -> None:
    """Write atomically (a reader never sees half a file)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


def parse(text: str, key: Optional[dict]) -> list:
    """The overrides of a tuned file's text for a machine with ``key`` (None: skip the key check); TunedFileError
    naming why it cannot be used."""
    from .library import ROW_NAME
    from .ops import FAMILIES

    try:
        doc = json.loads(text)
    except ValueError as e:
        raise TunedFileError(f"not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise TunedFileError("not a JSON object")
    if doc.get("version") != VERSION:
        raise TunedFileError(f"version {doc.get('version')!r}; this package reads version {VERSION} "
                             "(run `blockfp8 tune` again)")
    have = doc.get("key")
    if not isinstance(have, dict):
        raise TunedFileError("no machine key")
    if key is not None:
        for field in KEY_FIELDS:
            if have.get(field) != key.get(field):
                raise TunedFileError(f"stale: measured with {field} {have.get(field)!r}, this process has "
                                     f"{key.get(field)!r} (run `blockfp8 tune` again)")
    entries = doc.get("overrides")
    if not isinstance(entries, list):
        raise TunedFileError("'overrides' is not a list")
    out = []
    for i, e in enumerate(entries):
        ok = (isinstance(e, dict) and e.get("family") in FAMILIES and isinstance(e.get("row"), str)
              and ROW_NAME.fullmatch(e["row"]) is not None
              and all(isinstance(e.get(f), int) and not isinstance(e.get(f), bool) and 1 <= e[f] < 2**62
                      for f in _ENTRY_INTS)
              and e["m_min"] <= e["m_max"])
        if not ok:
            raise TunedFileError(f"overrides[{i}] is malformed: {e!r}")
        out.append({f: e[f] for f in ("family", "n", "k", "m_min", "m_max", "row")})
    return out


def find(model_dir: Optional[str]) -> Optional[Path]:
    """BLOCKFP8_TUNED_CONFIG's path (``none``: no file at all), else FILE_NAME in the model's directory."""
    explicit = os.environ.get(ENV, "")
    if explicit:
        return None if explicit.lower() == "none" else Path(explicit)
    if not model_dir:
        return None
    path = Path(model_dir) / FILE_NAME
    return path if path.is_file() else None


def _warn_once(path: Path, why: str) -> None:
    if str(path) not in _warned:
        _warned.add(str(path))
        logger.warning("blockfp8: ignoring the tuned config %s: %s", path, why)


def load(model_dir: Optional[str] = None, key: Optional[dict] = None,
         apply: Optional[Callable[[list], None]] = None) -> list:
    """Find the tuned file for ``model_dir``, check it against this machine and hand its overrides to the ops
    (``apply``: ops.set_tuned_rows). Returns the overrides applied ([] when none or ignored, with one warning)."""
    path = find(model_dir)
    if path is None:
        return []
    if key is None:
        key = machine_key()
        if key is None:  # no GPU or no kernels: nothing to override
            STATE.update(path=str(path), ignored="the kernels cannot run in this process")
            return []
    if apply is None:
        from .ops import set_tuned_rows as apply
    try:
        entries = parse(path.read_bytes().decode("utf-8"), key)
        apply(entries)  # the op checks the entries again: a refusal is a ValueError, ignored like a bad file
    except OSError as e:
        why = f"cannot read it ({e.strerror or e})"
    except UnicodeDecodeError:
        why = "not UTF-8 text"
    except (TunedFileError, ValueError) as e:
        why = str(e)
    else:
        STATE.clear()
        STATE.update(path=str(path), overrides=len(entries))
        logger.info("blockfp8: %d tuned row override(s) from %s", len(entries), path)
        return entries
    STATE.clear()
    STATE.update(path=str(path), ignored=why)
    _warn_once(path, why)
    return []


def model_dir_of(model: Optional[str]) -> Optional[str]:
    """The local directory of a model name or path (a Hugging Face id resolves through the local hub cache)."""
    if not model:
        return None
    if Path(model).is_dir():
        return model
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(model, "config.json")
    except Exception:
        return None
    return str(Path(found).parent) if isinstance(found, str) else None
