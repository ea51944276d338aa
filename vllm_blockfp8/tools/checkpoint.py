"""Checkpoint I/O for the quantize tool: read a Hugging Face safetensors directory tensor by tensor,
write safetensors shards as a stream, copy the side files, swap the result into place.

Shards are written by hand (the format is an 8-byte little-endian header length, a JSON header,
then the raw little-endian bytes in header order) because ``safetensors.torch.save_file`` needs
every tensor of a shard in memory at once; streaming keeps peak memory at one row chunk.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from contextlib import ExitStack
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

import torch

from .paths import CheckpointError, check_destination, check_source  # noqa: F401 - re-exported

INDEX_NAME = "model.safetensors.index.json"

# safetensors dtype names and their sizes in bytes.
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "BF16": 2, "F16": 2, "I16": 2,
               "U16": 2, "F32": 4, "I32": 4, "U32": 4, "F64": 8, "I64": 8, "U64": 8}
TORCH_TO_ST = {torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.float8_e4m3fn: "F8_E4M3",
               torch.float8_e5m2: "F8_E5M2", torch.bfloat16: "BF16", torch.float16: "F16",
               torch.int16: "I16", torch.float32: "F32", torch.int32: "I32", torch.float64: "F64",
               torch.int64: "I64"}

# Never copied as side files: weights in any format (a stale copy would shadow ours) and files we rewrite.
_SKIP_FILES = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.h5", "*.msgpack", "*.gguf",
               "*.onnx", "*.index.json", "config.json", "hf_quant_config.json", "quantization_report.json")


@dataclass(frozen=True)
class SourceTensor:
    name: str
    file: Path
    shape: tuple
    dtype: str

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_BYTES.get(self.dtype, 1)


def read_config(src: Path) -> dict:
    path = check_source(src)
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    return config


def _list_file(path: Path) -> list:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return [SourceTensor(k, path, tuple(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype())
                    for k in f.keys()]
    except Exception as e:  # safetensors raises its own error types for truncated/corrupt files
        raise CheckpointError(f"cannot read {path}: {e}") from None


def scan_sources(src: Path) -> list:
    """Every tensor of SRC (headers only), in file order. Checks the index against the files."""
    index_path = src / INDEX_NAME
    if index_path.is_file():
        try:
            weight_map = json.loads(index_path.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"bad index {index_path}: {e!r}") from None
        if not isinstance(weight_map, dict) or not weight_map or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
            raise CheckpointError(f"bad index {index_path}: weight_map must map tensor names to files")
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not (src / f).is_file()]
        if missing:
            raise CheckpointError(f"bad index {index_path}: shard(s) missing: {', '.join(missing)}")
        tensors = [t for f in files for t in _list_file(src / f) if t.name in weight_map]
        found = {t.name: t.file.name for t in tensors}
        wrong = [k for k, f in weight_map.items() if found.get(k) != f]
        if wrong:
            raise CheckpointError(f"bad index {index_path}: {len(wrong)} tensor(s) not in the shard the "
                                  f"index names, e.g. {wrong[0]!r}")
        return tensors
    files = sorted(src.glob("*.safetensors"))
    if not files:
        bins = sorted(p.name for p in src.glob("*.bin"))
        hint = f" (found {bins[0]}: PyTorch .bin checkpoints are not supported)" if bins else ""
        raise CheckpointError(f"SRC {src} has no *.safetensors weights{hint}")
    tensors = [t for f in files for t in _list_file(f)]
    names = [t.name for t in tensors]
    if len(set(names)) != len(names):
        raise CheckpointError(f"SRC {src}: a tensor name appears in more than one shard and there is no index")
    return tensors


class SourceReader:
    """Open safetensors files once each; read tensors whole or as row chunks."""

    def __init__(self):
        self._stack = ExitStack()
        self._handles = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._stack.close()

    def _handle(self, path: Path):
        from safetensors import safe_open

        if path not in self._handles:
            self._handles[path] = self._stack.enter_context(safe_open(str(path), framework="pt"))
        return self._handles[path]

    def rows(self, t: SourceTensor, chunk_rows: int):
        """Yield row chunks of t (the whole tensor when 0-d or small)."""
        h = self._handle(t.file)
        if len(t.shape) == 0 or t.shape[0] <= chunk_rows:
            yield h.get_tensor(t.name)
            return
        sl = h.get_slice(t.name)
        for r0 in range(0, t.shape[0], chunk_rows):
            yield sl[r0:r0 + chunk_rows]


class ShardWriter:
    """Write one safetensors file whose header (names, dtypes, shapes) is known up front.

    ``entries`` is a list of (name, dtype, shape); tensors must then arrive in that order, each
    either whole or as consecutive row chunks. Leaving the ``with`` block normally checks that every
    byte was written; leaving it by an exception just closes the file.
    """

    def __init__(self, path: Path, entries: list):
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for name, dtype, shape in entries:
            size = math.prod(shape) * DTYPE_BYTES[dtype]
            header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
            offset += size
        self.total, self.written, self.path = offset, 0, path
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned
        self._f = open(path, "wb")
        self._f.write(len(raw).to_bytes(8, "little") + raw)

    def write(self, tensor: torch.Tensor) -> None:
        data = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
        self._f.write(data.data)
        self.written += data.size

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        self._f.close()
        if exc_type is None and self.written != self.total:
            raise RuntimeError(f"{self.path}: wrote {self.written} bytes of tensor data, header says {self.total}")


def copy_side_files(src: Path, dst: Path) -> list:
    """Copy tokenizer, generation config and other top-level non-weight files; returns their names."""
    copied = []
    for p in sorted(src.iterdir()):
        if p.is_file() and not any(fnmatch(p.name, pat) for pat in _SKIP_FILES):
            shutil.copy2(p, dst / p.name)
            copied.append(p.name)
    return copied


def commit(tmp: Path, dst: Path) -> None:
    """Move the finished tmp directory to dst, replacing what is there (already checked by the caller)."""
    if dst.exists() or dst.is_symlink():
        old = dst.parent / f".{dst.name}.old-{os.getpid()}"
        os.replace(dst, old)
        os.replace(tmp, dst)
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old)
        else:
            old.unlink()
    else:
        os.replace(tmp, dst)


class Progress:
    """A byte counter on stderr: tqdm when importable, else a line per 5%."""

    def __init__(self, total: int, desc: str, enabled: bool = True):
        self.total, self.desc, self.done, self._last, self._bar = max(total, 1), desc, 0, -1, None
        self.enabled = enabled
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self._bar = tqdm(total=total, desc=desc, unit="B", unit_scale=True, file=sys.stderr)

    def update(self, n: int) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
        elif self.enabled:
            pct = 100 * self.done // self.total
            if pct // 5 != self._last // 5:
                self._last = pct
                print(f"{self.desc}: {pct}%", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
