"""Command-line tools behind the ``blockfp8`` console script (``vllm_blockfp8.cli``).

``quantize`` writes block FP8 / NVFP4 checkpoints (tools/quantize.py, I/O in tools/checkpoint.py);
``info`` reports versions, the GPU and the compiled kernels (tools/info.py).
"""

from __future__ import annotations


def package_version() -> str:
    """The installed distribution's version, or the package attribute in a source checkout."""
    from importlib import metadata

    for dist in ("vllm_blockfp8", "vllm-blockfp8"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    import vllm_blockfp8

    return str(getattr(vllm_blockfp8, "__version__", "unknown (not installed)"))
