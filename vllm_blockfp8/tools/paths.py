"""The quantize tool's path checks, free of torch so that ``blockfp8 quantize`` refuses a bad SRC or
DST at once, before the seconds of importing torch (tools/checkpoint.py re-exports these)."""

from __future__ import annotations

from pathlib import Path


class CheckpointError(ValueError):
    """A refusal with a message for the user: bad SRC, existing DST, a shape we cannot quantize."""


def check_source(src: Path) -> Path:
    """SRC is a Hugging Face model directory: returns its config.json."""
    if not src.is_dir():
        raise CheckpointError(f"SRC {src} is not a directory")
    path = src / "config.json"
    if not path.is_file():
        raise CheckpointError(f"SRC {src} has no config.json: not a Hugging Face model directory")
    return path


def check_destination(src: Path, dst: Path, overwrite: bool) -> None:
    if dst == src or dst in src.parents:
        raise CheckpointError(f"DST {dst} would replace SRC {src}: pick another directory")
    if dst.exists() and not overwrite:
        if not dst.is_dir() or any(dst.iterdir()):
            raise CheckpointError(f"DST {dst} exists and is not empty (pass --overwrite to replace it)")
