"""vllm_blockfp8: a vLLM quantization plugin for block-scaled FP8 and NVFP4 checkpoints.

``register()`` is the ``vllm.general_plugins`` entry point: vLLM calls it in every process
(the API server too), so it only registers the ``blockfp8`` quantization config. It is
idempotent, imports nothing heavy beyond vLLM's config registry, and never touches CUDA.
"""

from __future__ import annotations

__version__ = "0.1.0"

_registered = False


def register() -> None:
    """Register the ``blockfp8`` quantization method with vLLM (safe to call many times)."""
    global _registered
    if _registered:
        return
    from vllm.model_executor.layers.quantization import register_quantization_config

    from .config import BlockFp8Config

    register_quantization_config("blockfp8")(BlockFp8Config)
    _registered = True
