"""vLLM linear methods: block FP8 and NVFP4 through ``vllm_blockfp8.ops``.

``create_weights`` uses vLLM's parameter classes so weight_loader_v2 slices weights and scales for
column, merged-column (gate_up), QKV and row-parallel layers under tensor parallelism;
``process_weights_after_loading`` does all repacking once; ``apply`` is one op call.
"""

from __future__ import annotations

import logging

import torch
from torch.nn import Parameter
from vllm.model_executor.layers.linear import LinearMethodBase, register_weight_loader_v2_supported_method
from vllm.model_executor.parameter import BlockQuantScaleParameter, ModelWeightParameter, PerTensorScaleParameter

from .. import ops, reference

logger = logging.getLogger("vllm_blockfp8")

BLOCK = 128


def _layer_name(layer: torch.nn.Module) -> str:
    return getattr(layer, "prefix", "") or type(layer).__name__


def check_block_shards(layer: torch.nn.Module, input_size: int, output_size: int, input_size_per_partition: int,
                       output_partition_sizes: list[int]) -> bool:
    """Refuse shards whose 128x128 scale blocks would have to be split between tensor-parallel
    ranks (vLLM issue #52997), naming the layer, the size and the fix. Returns True for an unsplit
    fused layer (QKV, gate_up) with a shard that is not a multiple of 128 rows: those load into
    per-shard scale rows and are fused in process_weights_after_loading (fuse_shard_scales)."""
    name = _layer_name(layer)
    fix = ("use a tensor-parallel size that keeps every shard a multiple of 128, or requantize the "
           "checkpoint with `blockfp8 quantize` so each projection's size is a multiple of 128")
    if input_size_per_partition != input_size and input_size_per_partition % BLOCK:
        raise ValueError(f"blockfp8: layer {name}: the input shard K = {input_size_per_partition} (of {input_size}) "
                         f"is not a multiple of 128, so its block scales cannot be split; {fix}")
    if input_size_per_partition % 16:
        raise ValueError(f"blockfp8: layer {name}: K = {input_size_per_partition} is not a multiple of 16, which "
                         "every blockfp8 kernel needs; serve this model with vLLM's fp8 or pad K at quantization")
    if sum(output_partition_sizes) != output_size:  # split across ranks: each slice must start on a block
        for size in output_partition_sizes:
            if size % BLOCK:
                raise ValueError(f"blockfp8: layer {name}: an output shard of N = {size} (partitions "
                                 f"{output_partition_sizes}) is not a multiple of 128, so its block scales "
                                 f"cannot be split between ranks; {fix}")
        return False
    # Unsplit: only a fused layer whose shard ends mid-block needs the per-shard scale layout.
    return any(size % BLOCK for size in output_partition_sizes[:-1])


class ShardBlockScaleParameter(BlockQuantScaleParameter):
    """Block scales of an unsplit fused layer whose shards are not multiples of 128 rows.

    Shard i's ceil(size_i / 128) scale rows sit at their own offset; vLLM's loader would put them
    at ceil(offset_i / 128), overlapping the previous shard's last row. Set ``shard_starts`` and
    ``shard_rows`` after construction.
    """

    shard_starts: list
    shard_rows: list

    def _load_shard(self, index: int, loaded_weight: torch.Tensor) -> None:
        start, rows = self.shard_starts[index], self.shard_rows[index]
        if tuple(loaded_weight.shape) != (rows, self.data.shape[1]):
            raise ValueError(f"blockfp8: shard {index} scales must be [{rows}, {self.data.shape[1]}], got "
                             f"{list(loaded_weight.shape)} (fused-on-disk checkpoints with ragged shards are "
                             "not supported)")
        self.data.narrow(0, start, rows).copy_(loaded_weight)

    def load_merged_column_weight(self, loaded_weight: torch.Tensor, **kwargs) -> None:
        self._load_shard(int(kwargs["shard_id"]), loaded_weight)

    def load_qkv_weight(self, loaded_weight: torch.Tensor, **kwargs) -> None:
        self._load_shard("qkv".index(kwargs["shard_id"]), loaded_weight)


def fuse_shard_scales(q: torch.Tensor, shard_scales: torch.Tensor, widths: list[int]):
    """Turn per-shard block scales into the kernels' layout: one scale per 128 fused rows.

    A fused 128-row block inside one shard keeps its scale and bytes. A block that straddles two
    shards takes the larger scale of each 128-wide K column and its rows from the other shard are
    requantized to it (exact dequantization in fp32, then round to nearest e4m3): those values
    gain at most half an e4m3 step of the larger scale. Returns (q, scale, requantized_rows).
    """
    n, k = q.shape
    row_block = torch.cat([start + torch.arange(w) // BLOCK for start, w in
                           zip(_shard_scale_starts(widths), widths)]).to(shard_scales.device)
    row_scale = shard_scales[row_block]                          # [N, ceil(K/128)]
    blocks = -(-n // BLOCK)
    padded = torch.cat([row_scale, row_scale[-1:].expand(blocks * BLOCK - n, -1)])
    fused = padded.reshape(blocks, BLOCK, -1).amax(dim=1)        # [ceil(N/128), ceil(K/128)]
    target = fused.repeat_interleave(BLOCK, 0)[:n]
    rows = (row_scale != target).any(dim=1).nonzero().flatten()
    if rows.numel():
        old = row_scale[rows].repeat_interleave(BLOCK, 1)[:, :k]
        new = target[rows].repeat_interleave(BLOCK, 1)[:, :k]
        values = q[rows].float() * old / new
        q = q.clone()
        q[rows] = values.clamp(-reference.FP8_MAX, reference.FP8_MAX).to(q.dtype)
    return q, fused.contiguous(), int(rows.numel())


def _shard_scale_starts(widths: list[int]) -> list[int]:
    starts, row = [], 0
    for w in widths:
        starts.append(row)
        row += -(-w // BLOCK)
    return starts


@register_weight_loader_v2_supported_method
class BlockFp8LinearMethod(LinearMethodBase):
    """Block FP8: weight e4m3 [N, K], ``weight_scale_inv`` fp32 [ceil(N/128), ceil(K/128)] (a
    multiplier despite the checkpoint's name)."""

    def __init__(self, quant_config) -> None:
        self.quant_config = quant_config

    def create_weights(self, layer: torch.nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list[int], input_size: int, output_size: int,
                       params_dtype: torch.dtype, **extra_weight_attrs) -> None:
        ragged = check_block_shards(layer, input_size, output_size, input_size_per_partition,
                                    output_partition_sizes)
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
        k_blocks = -(-input_size_per_partition // BLOCK)
        shard_rows = [-(-w // BLOCK) for w in output_partition_sizes]
        scale_cls = ShardBlockScaleParameter if ragged else BlockQuantScaleParameter
        scale = scale_cls(data=torch.full((sum(shard_rows) if ragged else -(-n // BLOCK), k_blocks), float("nan"),
                                          dtype=torch.float32),
                          input_dim=1, output_dim=0, weight_loader=weight_loader)
        if ragged:
            scale.shard_starts, scale.shard_rows = _shard_scale_starts(output_partition_sizes), shard_rows
        layer.blockfp8_ragged_shards = ragged
        layer.register_parameter("weight_scale_inv", scale)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        scale = layer.weight_scale_inv.data
        if torch.isnan(scale).any():
            raise ValueError(f"blockfp8: layer {_layer_name(layer)}: some weight_scale_inv blocks were never "
                             "loaded; the checkpoint is missing scales for this layer")
        weight = layer.weight.data
        if getattr(layer, "blockfp8_ragged_shards", False):
            weight, scale, requantized = fuse_shard_scales(weight, scale, layer.logical_widths)
            logger.warning("blockfp8: layer %s: fused shards %s are not multiples of 128 rows; %d rows of the "
                           "128-row blocks they share were requantized to one scale per block",
                           _layer_name(layer), layer.logical_widths, requantized)
        layer.weight = Parameter(weight.contiguous(), requires_grad=False)
        layer.weight_scale_inv = Parameter(scale.contiguous(), requires_grad=False)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return ops.blockfp8_linear(x, layer.weight, layer.weight_scale_inv, bias)


_told_nvfp4_path: set = set()


def _log_nvfp4_path_once(native: bool, why: str) -> None:
    """One line per distinct reason: which NVFP4 path the layers run and why."""
    if why in _told_nvfp4_path:
        return
    _told_nvfp4_path.add(why)
    if native:
        logger.info("blockfp8: NVFP4 runs W4A4 above M = 16 on this GPU (activations quantized with the checkpoint's "
                    "input_scale, native FP4 GEMM; decode keeps the weight-only GEMV); BLOCKFP8_NVFP4_W4A16=1 "
                    "keeps it weight-only")
    else:
        logger.info("blockfp8: NVFP4 runs weight-only (W4A16): %s", why)


def _nvfp4_native_reason(layer: torch.nn.Module, shard_scales: torch.Tensor) -> str | None:
    """None when the layer can run the native W4A4 GEMM on its GPU, else why not (host-side, at load)."""
    weight = layer.weight.data
    if not weight.is_cuda:
        return "the weights are not on a CUDA GPU"
    n, k = weight.shape[0], weight.shape[1] * 2
    plan = ops.nvfp4_native_path(torch.cuda.get_device_capability(weight.device), 4096, n, k)
    if not plan["native"]:
        return plan["why"]
    if torch.isnan(layer.input_scale.data).any():
        return "the checkpoint has no input_scale (the activation global scale W4A4 needs)"
    if not bool((shard_scales == shard_scales[0]).all()):  # one sync, at load
        return "fused shards have different weight_scale_2 and the native epilogue takes one alpha"
    return None


@register_weight_loader_v2_supported_method
class Nvfp4LinearMethod(LinearMethodBase):
    """ModelOpt NVFP4, weight-only: weight uint8 [N, K/2], weight_scale e4m3 [N, K/16],
    weight_scale_2 fp32 per fused shard (kept per output row, so shards with different global
    scales stay exact), input_scale per shard. Weight-only (W4A16) everywhere; on SM120 the layer
    also keeps a swizzled copy of weight_scale (+1/16 byte per parameter: the plain one stays for
    the decode GEMV) and alpha = input_scale * weight_scale_2, and M > 16 runs W4A4 natively. Layers
    that stay weight-only repack the weight once at load (ops.nvfp4_layer_packing): on SM90 into the
    fragment packing (ops.fragment_nvfp4_weight: each lane of the tensor-core kernels loads exactly its
    mma fragment, scales as exp8 bytes), elsewhere into the paired one (ops.pair_nvfp4_weight: a bit
    order that decodes each pair of values with one shift and one mask); native layers keep the
    checkpoint packing, which CUTLASS's GEMM reads."""

    def __init__(self, quant_config) -> None:
        self.quant_config = quant_config

    def create_weights(self, layer: torch.nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list[int], input_size: int, output_size: int,
                       params_dtype: torch.dtype, **extra_weight_attrs) -> None:
        if input_size_per_partition % 32:
            split = "" if input_size_per_partition == input_size else (
                f" (K = {input_size} split across {input_size // input_size_per_partition} tensor-parallel ranks); "
                "use a tensor-parallel size that keeps K / size a multiple of 32")
            raise ValueError(f"blockfp8: layer {_layer_name(layer)}: NVFP4 needs K % 32 == 0 per shard, got "
                             f"K = {input_size_per_partition}{split}")
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
        why = _nvfp4_native_reason(layer, shard_scales)
        layer.blockfp8_nvfp4_native = why is None
        layer.blockfp8_nvfp4_packing = "modelopt"
        if why is not None:
            weight, scale, packing = ops.nvfp4_layer_weight(layer.weight.data, layer.weight_scale.data)
            if packing != ops.nvfp4_layer_packing(weight.shape[0], 2 * weight.shape[1], weight.device):
                logger.warning("blockfp8: layer %s has negative NVFP4 weight scales, so it keeps the paired packing: "
                               "its M > 16 runs the mma.sync W4A16 GEMM, not the SM90 wgmma one", _layer_name(layer))
            layer.weight = Parameter(weight, requires_grad=False)
            layer.weight_scale = Parameter(scale, requires_grad=False)
            layer.blockfp8_nvfp4_packing = packing
        else:
            # Fused shards see the same input, so their input_scales agree; the largest never clips.
            native = ops.nvfp4_native_operands(layer.weight_scale.data, layer.input_scale.data.max().reshape(1),
                                               shard_scales[:1])
            for name, value in (("weight_scale_swizzled", native["b_scale_swizzled"]),
                                ("input_scale_native", native["input_scale"]), ("alpha_native", native["alpha"])):
                setattr(layer, name, Parameter(value, requires_grad=False))
        del layer.weight_scale_2
        del layer.input_scale
        _log_nvfp4_path_once(why is None, why or "native")

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        native = None
        if layer.blockfp8_nvfp4_native:
            native = {"b_scale_swizzled": layer.weight_scale_swizzled, "input_scale": layer.input_scale_native,
                      "alpha": layer.alpha_native}
        return ops.nvfp4_linear(x, layer.weight, layer.weight_scale, layer.weight_global_scale, bias, native=native,
                                packing=layer.blockfp8_nvfp4_packing)
