"""NVFP4 weight-only (W4A16) peers of bench_nvfp4, their operands and the first-output check.

Fp4Operands hold one NVFP4 weight and each peer's form of it, made outside the timed call. The
shared machinery (Peer, Checker, LazyCopies, probe, variants) is peers.py's.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from vllm_blockfp8 import reference

from .peers import CHECK_ROWS, Checker, Peer, _capability, _needs_cuda

# e2m1 x e4m3 (at most 6 significant bits, 2^-10..2688) is exact in bf16 and fp16, and every
# implementation accumulates in fp32, so a correct one differs from the float64 reference by its
# 16-bit roundings only (u = 2^-8 for bf16). Ours rounds once (fp32 sum times the fp32 global
# scale): held to u in norm, reference.assert_close_to_ref's bound. vLLM's Marlin rounds the fp32
# sum to 16 bits, then multiplies by the global scale, itself rounded to 16 bits, in 16-bit math
# (marlin_template.h, write()); cuBLAS gets the weight with the global scale folded in, rounded to
# bf16 (Fp4Weight.bf16). CPU emulations (tests/test_bench_nvfp4.py) measured 0.42-0.45u, 0.6-0.95u
# and 0.56-0.73u; peers are held to 3u. A lost 16-value group of 64 moves the output ~12%.
FP4_OURS_TOL = reference.unit_roundoff(torch.bfloat16)
FP4_PEER_TOL = 3 * FP4_OURS_TOL


class Fp4Weight:
    """One rotating copy of an NVFP4 weight: reference.quantize_nvfp4 of randn [N, K] (packed uint8
    [N, K/2], e4m3 scales [N, K/16], fp32 0-dim global scale), our layer's form (the packing it stores on
    this GPU, one global scale per row: made here), and each peer's form of the same numbers, made on first use:
    outside the timed call, and only for the variants that run."""

    def __init__(self, n: int, k: int, *, device="cuda", dtype=torch.bfloat16):
        self.n, self.k, self.dtype = n, k, dtype
        self.packed, self.scale, self.global_scale = reference.quantize_nvfp4(
            torch.randn(n, k, device=device))
        # The form our layer passes (layers/linear.py Nvfp4LinearMethod): one fp32 scale per output
        # row, so fused q/k/v shards keep their own; all equal here.
        self.row_scale = self.global_scale.reshape(1).expand(n).contiguous()
        # What our layer stores and passes (ops.nvfp4_layer_weight: (b, b_scale, packing)), made here so no
        # timed call or graph capture ever makes it; Marlin and the other peers read ``packed``.
        from vllm_blockfp8 import ops
        self.layer = ops.nvfp4_layer_weight(self.packed, self.scale)

    @functools.cached_property
    def bf16(self) -> torch.Tensor:
        """[N, K] bf16 with the global scale folded in (what a bf16 model of these weights holds):
        applied apart, it would cost the timed call a pass over the output that no bf16 GEMM pays."""
        return reference.dequantize_nvfp4(self.packed, self.scale, self.global_scale).to(self.dtype)

    @functools.cached_property
    def fp8(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(b, b_scale): the dequantized weight quantized to block FP8 (our FP8 linear's input)."""
        return reference.quantize_block_fp8(
            reference.dequantize_nvfp4(self.packed, self.scale, self.global_scale))

    @functools.cached_property
    def marlin(self) -> SimpleNamespace:
        """vLLM's own repack, as its ModelOpt NVFP4 path builds it: weight_global_scale =
        weight_scale_2.max() (0-dim fp32 multiplier, not inverted), then
        MarlinNvFp4LinearKernel.process_weights_after_loading = prepare_fp4_layer_for_marlin(layer):
        the weight as int32 [N, K/8], transposed, padded, gptq_marlin_repack'ed (num_bits=4); scales
        transposed, to params_dtype, padded, permuted, to its S0E5M3 fp8 layout; the global scale
        times 2^(exponent bias - 7); a workspace of one int per SM (marlin_make_workspace_new)."""
        layer = SimpleNamespace(weight=self.packed, weight_scale=self.scale,
                                weight_global_scale=self.global_scale.reshape(()).float(),
                                output_size_per_partition=self.n, input_size_per_partition=self.k,
                                params_dtype=self.dtype)
        marlin_fp4_api()[0].prepare(layer)  # replaces weight, weight_scale, weight_global_scale
        return layer


@dataclass
class Fp4Operands:
    """One rotating copy of an NVFP4 point: x [M, K] and a weight shared by every M of the shape."""
    x: torch.Tensor
    w: Fp4Weight


class Fp4Checker(Checker):
    """The first output against reference.nvfp4_linear_ref (float64) of copy 0's first rows."""

    def _ref(self, kind: str) -> torch.Tensor:
        if kind not in self._refs:
            o = self._copies[0]
            self._refs[kind] = reference.nvfp4_linear_ref(o.x[:CHECK_ROWS], o.w.packed, o.w.scale,
                                                          o.w.global_scale)
        return self._refs[kind]

    def linear(self, *kinds: str, tol: float = FP4_PEER_TOL):
        return super().linear(*kinds, tol=tol)


@functools.cache
def marlin_fp4_api():
    """(vLLM's Marlin FP4 entry points, None) or (None, why not); imported apart from vllm_api(),
    so that a missing DeepGEMM or CUTLASS op does not take Marlin with it."""
    try:
        import vllm
        from vllm.model_executor.layers.quantization.utils import marlin_utils_fp4 as fp4
    except Exception as exc:
        return None, f"vllm not importable: {type(exc).__name__}: {exc}"
    return SimpleNamespace(version=vllm.__version__, prepare=fp4.prepare_fp4_layer_for_marlin,
                           apply=fp4.apply_fp4_marlin_linear,
                           supported=fp4.is_fp4_marlin_supported), None


def _marlin_fp4_unavailable():
    api, why = marlin_fp4_api()
    if why:
        return why
    if not api.supported():
        return "vLLM's is_fp4_marlin_supported() is False (Marlin FP4 needs SM75+), this GPU is SM%d%d" % _capability()
    return None


def _marlin_fp4_build(o: Fp4Operands, mode: str):
    api, layer, x = marlin_fp4_api()[0], o.w.marlin, o.x
    # MarlinNvFp4LinearKernel.apply_weights, argument for argument.
    return lambda: api.apply(input=x, weight=layer.weight, weight_scale=layer.weight_scale,
                             weight_global_scale=layer.weight_global_scale,
                             workspace=layer.workspace, size_n=o.w.n, size_k=o.w.k, bias=None)


def _fp4_rejects(m, n, k):
    return None if k % 32 == 0 else f"K={k} is not a multiple of 32 (NVFP4 packing)"


FP4_PEERS = (
    Peer("marlin_fp4", "vllm (apply_fp4_marlin_linear on prepare_fp4_layer_for_marlin's repack: "
         "MarlinNvFp4LinearKernel, W4A16), SM75+", "w4a16",
         lambda: _needs_cuda() or _marlin_fp4_unavailable(), _fp4_rejects, _marlin_fp4_build),
    Peer("bf16", "CUDA (cuBLAS bf16 GEMM on the dequantized weight, global scale folded in)",
         "w4a16", _needs_cuda, _fp4_rejects,
         lambda o, mode: (lambda x=o.x, w=o.w.bf16: torch.mm(x, w.t()))),
)
