"""vLLM linear methods: block FP8 and NVFP4 through ``vllm_blockfp8.ops``.

``create_weights`` uses vLLM's parameter classes so weight_loader_v2 slices weights and scales for
column, merged-column (gate_up), QKV and row-parallel layers under tensor parallelism;
``process_weights_after_loading`` does all repacking once; ``apply`` is one op call.
"""

from __future__ import annotations

import torch
from torch.nn import Parameter
from vllm.model_executor.layers.linear import LinearMethodBase, register_weight_loader_v2_supported_method
from vllm.model_executor.parameter import BlockQuantScaleParameter, ModelWeightParameter, PerTensorScaleParameter

from .. import ops

BLOCK = 128


def _layer_name(layer: torch.nn.Module) -> str:
    return getattr(layer, "prefix", "") or type(layer).__name__


def check_block_shards(layer: torch.nn.Module, input_size: int, output_size: int, input_size_per_partition: int,
                       output_partition_sizes: list[int]) -> None:
    """Refuse shards whose 128x128 scale blocks would straddle two tensor-parallel ranks or two
    fused shards (vLLM issue #52997): name the layer, the size and the fix."""
    name = _layer_name(layer)
    fix = ("use a tensor-parallel size that keeps every shard a multiple of 128, or requantize the "
           "checkpoint with `blockfp8 quantize` so each projection's size is a multiple of 128")
    if input_size_per_partition != input_size and input_size_per_partition % BLOCK:
        raise ValueError(f"blockfp8: layer {name}: the input shard K = {input_size_per_partition} (of {input_size}) "
                         f"is not a multiple of 128, so its block scales cannot be split; {fix}")
    tp_split = sum(output_partition_sizes) != output_size
    merged = len(output_partition_sizes) > 1
    # The last shard of an unsplit fused layer may be ragged: its scale rows end the tensor.
    sizes = output_partition_sizes if tp_split else output_partition_sizes[:-1]
    for size in sizes if (tp_split or merged) else []:
        if size % BLOCK:
            raise ValueError(f"blockfp8: layer {name}: an output shard of N = {size} (partitions "
                             f"{output_partition_sizes}) is not a multiple of 128, so its block scales cannot "
                             f"be split; {fix}")
    if input_size_per_partition % 16:
        raise ValueError(f"blockfp8: layer {name}: K = {input_size_per_partition} is not a multiple of 16, which "
                         "every blockfp8 kernel needs; serve this model with vLLM's fp8 or pad K at quantization")


@register_weight_loader_v2_supported_method
class BlockFp8LinearMethod(LinearMethodBase):
    """Block FP8: weight e4m3 [N, K], ``weight_scale_inv`` fp32 [ceil(N/128), ceil(K/128)] (a
    multiplier despite the checkpoint's name)."""

    def __init__(self, quant_config) -> None:
        self.quant_config = quant_config

    def create_weights(self, layer: torch.nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list[int], input_size: int, output_size: int,
                       params_dtype: torch.dtype, **extra_weight_attrs) -> None:
        check_block_shards(layer, input_size, output_size, input_size_per_partition, output_partition_sizes)
        weight_loader = extra_weight_attrs.get("weight_loader")
        n = sum(output_partition_sizes)
        layer.logical_widths = output_partition_sizes
        layer.input_size_per_partition = input_size_per_partition
        layer.output_size_per_partition = n
        layer.orig_dtype = params_dtype
        # vLLM's fused-layer loaders read this to slice block scales per shard.
        layer.weight_block_size = [BLOCK, BLOCK]
        weight = ModelWeightParameter(
            data=torch.empty(n, input_size_per_partition, dtype=torch.float8_e4m3fn),
            input_dim=1, output_dim=0, weight_loader=weight_loader)
        layer.register_parameter("weight", weight)
        scale = BlockQuantScaleParameter(
            data=torch.full((-(-n // BLOCK), -(-input_size_per_partition // BLOCK)), float("nan"),
                            dtype=torch.float32),
            input_dim=1, output_dim=0, weight_loader=weight_loader)
        layer.register_parameter("weight_scale_inv", scale)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        scale = layer.weight_scale_inv.data
        if torch.isnan(scale).any():
            raise ValueError(f"blockfp8: layer {_layer_name(layer)}: some weight_scale_inv blocks were never "
                             "loaded; the checkpoint is missing scales for this layer")
        layer.weight = Parameter(layer.weight.data.contiguous(), requires_grad=False)
        layer.weight_scale_inv = Parameter(scale.contiguous(), requires_grad=False)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return ops.blockfp8_linear(x, layer.weight, layer.weight_scale_inv, bias)


@register_weight_loader_v2_supported_method
class Nvfp4LinearMethod(LinearMethodBase):
    """ModelOpt NVFP4, weight-only: weight uint8 [N, K/2], weight_scale e4m3 [N, K/16],
    weight_scale_2 fp32 per fused shard (kept per output row, so shards with different global
    scales stay exact), input_scale loaded and unused (no activation quantization)."""

    def __init__(self, quant_config) -> None:
        self.quant_config = quant_config

    def create_weights(self, layer: torch.nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list[int], input_size: int, output_size: int,
                       params_dtype: torch.dtype, **extra_weight_attrs) -> None:
        if input_size_per_partition % 32:
            raise ValueError(f"blockfp8: layer {_layer_name(layer)}: NVFP4 needs K % 32 == 0 per shard, got "
                             f"K = {input_size_per_partition}")
        weight_loader = extra_weight_attrs.get("weight_loader")
        n = sum(output_partition_sizes)
        layer.logical_widths = output_partition_sizes
        layer.input_size_per_partition = input_size_per_partition
        layer.output_size_per_partition = n
        group = self.quant_config.group_size
        layer.register_parameter("weight", ModelWeightParameter(
            data=torch.empty(n, input_size_per_partition // 2, dtype=torch.uint8),
            input_dim=1, output_dim=0, weight_loader=weight_loader))
        layer.register_parameter("weight_scale", ModelWeightParameter(
            data=torch.empty(n, input_size_per_partition // group, dtype=torch.float8_e4m3fn),
            input_dim=1, output_dim=0, weight_loader=weight_loader))
        for name in ("weight_scale_2", "input_scale"):
            layer.register_parameter(name, PerTensorScaleParameter(
                data=torch.full((len(output_partition_sizes),), float("nan"), dtype=torch.float32),
                weight_loader=weight_loader))

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        shard_scales = layer.weight_scale_2.data
        if torch.isnan(shard_scales).any():
            raise ValueError(f"blockfp8: layer {_layer_name(layer)}: weight_scale_2 missing from the checkpoint")
        widths = torch.tensor(layer.logical_widths, device=shard_scales.device)
        layer.weight_global_scale = Parameter(
            torch.repeat_interleave(shard_scales.float(), widths).contiguous(), requires_grad=False)
        layer.weight = Parameter(layer.weight.data.contiguous(), requires_grad=False)
        layer.weight_scale = Parameter(layer.weight_scale.data.contiguous(), requires_grad=False)
        del layer.weight_scale_2
        del layer.input_scale

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return ops.nvfp4_linear(x, layer.weight, layer.weight_scale, layer.weight_global_scale, bias)
