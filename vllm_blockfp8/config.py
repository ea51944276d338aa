"""The ``blockfp8`` quantization config for vLLM.

It reads three checkpoint forms and serves them through this package's kernels:

* its own: ``{"quant_method": "blockfp8", "format": "fp8_block" | "nvfp4", ...}``;
* block FP8 (DeepSeek-V3, Qwen3-FP8): ``{"quant_method": "fp8", "weight_block_size": [128, 128],
  "activation_scheme": "dynamic", "ignored_layers" | "modules_to_not_convert": [...]}``;
* ModelOpt NVFP4: ``config.json`` ``{"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore"}``
  or ``hf_quant_config.json`` ``{"quantization": {"quant_algo": "NVFP4", "exclude_modules"}}``.

The two foreign forms are claimed only when the user asked for ``--quantization blockfp8``
(``override_quantization_method``); otherwise vLLM's own ``fp8`` / ``modelopt_fp4`` keep them.
Ignored layers get vLLM's unquantized method; MoE layers and KV-cache scales are delegated to
vLLM's own block-FP8 / ModelOpt NVFP4 methods built from an equivalent inner config.
"""

from __future__ import annotations

import fnmatch
from typing import Any, Optional

import torch
from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig, QuantizeMethodBase
from vllm.model_executor.layers.quantization.utils.quant_utils import is_layer_skipped

FP8_BLOCK = "fp8_block"
NVFP4 = "nvfp4"
FORMATS = (FP8_BLOCK, NVFP4)
WEIGHT_BLOCK = [128, 128]


def _modelopt_algo(cfg: dict) -> Optional[str]:
    if not str(cfg.get("quant_method", "modelopt" if "quantization" in cfg else "")).lower().startswith("modelopt"):
        return None
    inner = cfg.get("quantization", cfg)
    return str(inner.get("quant_algo", "")).upper() if isinstance(inner, dict) else None


def detect_format(cfg: Optional[dict]) -> Optional[str]:
    """Which of our formats a checkpoint's quantization config describes, or None."""
    if not isinstance(cfg, dict):
        return None
    method = str(cfg.get("quant_method", "")).lower()
    if method == "blockfp8":
        return cfg.get("format", FP8_BLOCK)
    if method == "fp8" and cfg.get("weight_block_size") is not None:
        return FP8_BLOCK
    if _modelopt_algo(cfg) == "NVFP4":
        return NVFP4
    return None


_started = False


def _startup_once() -> None:
    """In the worker, where the GPU and the model are known, before the first linear layer is built: BLOCKFP8_FORCE's
    rows against this GPU's tables (a ValueError listing the valid rows stops `vllm serve` here), the model's
    tuned overrides (`blockfp8 tune`) handed to the ops, and the first-use check of rows never run on this GPU's
    architecture here, in a child process (first_use.py)."""
    global _started
    if _started:
        return
    _started = True
    from vllm.config import get_current_vllm_config

    from . import first_use, ops, tuning

    ops.check_forced_rows()
    model_config = getattr(get_current_vllm_config(), "model_config", None)
    tuning.load(tuning.model_dir_of(getattr(model_config, "model", None)))
    first_use.ensure_checked()


class BlockFp8Config(QuantizationConfig):
    """vLLM QuantizationConfig ``blockfp8``."""

    def __init__(self, fmt: str = FP8_BLOCK, ignored_layers: Optional[list[str]] = None,
                 weight_block_size: Optional[list[int]] = None, kv_cache_quant_algo: Optional[str] = None,
                 group_size: int = 16) -> None:
        super().__init__()
        if fmt not in FORMATS:
            raise ValueError(f"blockfp8: format must be one of {FORMATS}, got {fmt!r}")
        block = list(weight_block_size or WEIGHT_BLOCK)
        if fmt == FP8_BLOCK and block != WEIGHT_BLOCK:
            raise ValueError(f"blockfp8: weight_block_size must be {WEIGHT_BLOCK}, got {block}; requantize "
                             "the checkpoint with `blockfp8 quantize` or serve it with vLLM's fp8")
        if fmt == NVFP4 and group_size != 16:
            raise ValueError(f"blockfp8: NVFP4 group_size must be 16, got {group_size}")
        self.format = fmt
        self.ignored_layers = list(ignored_layers or [])
        self.weight_block_size = block if fmt == FP8_BLOCK else None
        self.kv_cache_quant_algo = kv_cache_quant_algo
        self.group_size = group_size

    def __repr__(self) -> str:
        return f"BlockFp8Config(format={self.format}, ignored_layers={self.ignored_layers})"

    @classmethod
    def get_name(cls) -> str:
        return "blockfp8"

    @classmethod
    def get_supported_act_dtypes(cls) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16]

    @classmethod
    def get_min_capability(cls) -> int:
        return 89

    @staticmethod
    def get_config_filenames() -> list[str]:
        return ["hf_quant_config.json"]

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "BlockFp8Config":
        fmt = detect_format(config)
        if fmt is None:
            raise ValueError(
                "blockfp8: unsupported quantization_config; expected quant_method 'blockfp8', 'fp8' with "
                f"weight_block_size, or ModelOpt NVFP4 (quant_algo 'NVFP4'), got {config!r}")
        method = str(config.get("quant_method", "")).lower()
        if fmt == NVFP4:
            inner = config.get("quantization", config)
            ignored = inner.get("exclude_modules", inner.get("ignore", config.get("ignore", []))) or []
            return cls(NVFP4, ignored_layers=ignored, kv_cache_quant_algo=inner.get("kv_cache_quant_algo"),
                       group_size=int(inner.get("group_size", 16) or 16))
        if method == "fp8" and config.get("activation_scheme", "dynamic") != "dynamic":
            raise ValueError("blockfp8: block FP8 needs activation_scheme 'dynamic', got "
                             f"{config.get('activation_scheme')!r}")
        ignored = (config.get("ignored_layers") or config.get("modules_to_not_convert") or [])
        return cls(FP8_BLOCK, ignored_layers=ignored, weight_block_size=config.get("weight_block_size"))

    @classmethod
    def override_quantization_method(cls, hf_quant_cfg, user_quant, hf_config=None) -> Optional[str]:
        # Claim block-FP8 and ModelOpt NVFP4 checkpoints only on request: without
        # --quantization blockfp8, vLLM's own fp8 / modelopt_fp4 methods keep them.
        if user_quant == "blockfp8" and detect_format(hf_quant_cfg) is not None:
            return "blockfp8"
        return None

    def apply_vllm_mapper(self, hf_to_vllm_mapper) -> None:
        if self.ignored_layers:
            self.ignored_layers = hf_to_vllm_mapper.apply_list(self.ignored_layers)

    # ----------------------------------------------------------------------------------------

    def is_layer_ignored(self, prefix: str) -> bool:
        """Exact names (fused layers through their shards, as vLLM's fp8 does) or wildcards."""
        exact = [p for p in self.ignored_layers if not any(c in p for c in "*?[")]
        patterns = [p for p in self.ignored_layers if any(c in p for c in "*?[")]
        if exact and is_layer_skipped(prefix, exact, self.packed_modules_mapping):
            return True
        if any(p == prefix or prefix.endswith("." + p) for p in exact):
            return True
        if not patterns:
            return False
        if any(fnmatch.fnmatchcase(prefix, p) for p in patterns):
            return True
        proj = prefix.split(".")[-1]
        shards = [prefix[: -len(proj)] + s for s in self.packed_modules_mapping.get(proj, [])]
        matched = [any(fnmatch.fnmatchcase(n, p) for p in patterns) for n in shards]
        if any(matched) and not all(matched):
            # As vLLM does for exact names: one fused layer cannot hold two precisions.
            raise ValueError(f"blockfp8: the ignore patterns {patterns} match only some shards of {prefix} "
                             f"({[n for n, m in zip(shards, matched) if m]}); all shards of a fused layer "
                             "must have the same precision")
        return bool(shards) and all(matched)

    def inner_vllm_config(self) -> QuantizationConfig:
        """vLLM's own config for the same checkpoint (MoE experts and KV-cache scales use it)."""
        if self.format == FP8_BLOCK:
            from vllm.model_executor.layers.quantization.fp8 import Fp8Config

            inner = Fp8Config(is_checkpoint_fp8_serialized=True, activation_scheme="dynamic",
                              ignored_layers=self.ignored_layers, weight_block_size=self.weight_block_size)
        else:
            from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config

            # By keyword: later vLLM (0.33) appends keyword-only arguments to this constructor.
            inner = ModelOptNvFp4Config(quant_method="NVFP4", is_checkpoint_nvfp4_serialized=True,
                                        kv_cache_quant_algo=self.kv_cache_quant_algo,
                                        exclude_modules=self.ignored_layers, group_size=self.group_size)
        inner.packed_modules_mapping = self.packed_modules_mapping
        return inner

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> Optional[QuantizeMethodBase]:
        from vllm.model_executor.layers.attention import Attention
        from vllm.model_executor.layers.fused_moe import RoutedExperts

        if isinstance(layer, LinearBase):
            _startup_once()
            if self.is_layer_ignored(prefix):
                return UnquantizedLinearMethod()
            from .layers.linear import BlockFp8LinearMethod, Nvfp4LinearMethod

            return BlockFp8LinearMethod(self) if self.format == FP8_BLOCK else Nvfp4LinearMethod(self)
        if isinstance(layer, (RoutedExperts, Attention)):
            if isinstance(layer, RoutedExperts) and self.is_layer_ignored(prefix):
                from vllm.model_executor.layers.fused_moe import UnquantizedFusedMoEMethod

                return UnquantizedFusedMoEMethod(layer.moe_config)
            return self.inner_vllm_config().get_quant_method(layer, prefix)
        return None

    @staticmethod
    def get_cache_scale_mapper():
        from vllm.model_executor.layers.quantization.fp8 import Fp8Config

        return Fp8Config.get_cache_scale_mapper()
