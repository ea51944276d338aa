"""``blockfp8 quantize``: turn a BF16/FP16 Hugging Face checkpoint into block FP8 or NVFP4.

What is quantized: every 2-D ``<module>.weight`` under ``model.layers.`` whose module ends in
``_proj`` (``kv_a_proj_with_mqa`` too) or sits under ``.experts.``, unless ``--ignore`` matches it
(fnmatch on the module or tensor name). Embeddings, norms, routers, lm_head and ignored modules keep
their dtype and bytes, and are listed in the config's exclusion list.

Formats (what vLLM 0.26 loads, with ``--quantization blockfp8`` or its own ``fp8`` /
``modelopt_fp4``):

* ``fp8-block``: ``weight`` float8_e4m3fn [N, K] + ``weight_scale_inv`` fp32 [ceil(N/128),
  ceil(K/128)] (a multiplier despite the name) from ``reference.quantize_block_fp8``; config.json
  ``quantization_config = {quant_method: fp8, fmt: e4m3, activation_scheme: dynamic,
  weight_block_size: [128, 128], modules_to_not_convert: [...]}``.
* ``nvfp4``: ``weight`` uint8 [N, K/2], ``weight_scale`` float8_e4m3fn [N, K/16], ``weight_scale_2``
  fp32 scalar from ``reference.quantize_nvfp4``, ``input_scale`` fp32 scalar; config.json
  ``{quant_method: modelopt, quant_algo: NVFP4, group_size: 16, ignore: [...]}`` plus
  hf_quant_config.json in ModelOpt's layout. vLLM fuses q/k/v, gate/up (per expert) and
  q_a/kv_a into one layer with ONE global scale, so those siblings share ``weight_scale_2`` (the
  group's amax / 2688, as ModelOpt exports it); this costs one extra read pass over the weights.
  ``input_scale`` is a placeholder of 1.0 (no calibration data): it is the activation global
  scale amax_x / (6 * 448), so 1.0 assumes |x| <= 2688 (larger activations saturate) and keeps
  16-value block scales in e4m3's normal range for block amax >= 6 * 2^-6 ~ 0.094. It only matters
  to W4A4 kernels (vLLM's modelopt_fp4 on Blackwell); weight-only NVFP4 paths ignore it.

Weights are streamed in chunks of 128-row multiples (block FP8 tiles never straddle a chunk, NVFP4
rows are independent), so the bytes equal one whole-tensor reference call, and peak memory is a few
fp32 copies of one chunk (CHUNK_ELEMENTS values) plus one tensor's scales, whatever the model size.
Output goes to ``.<DST>.tmp-<pid>`` beside DST and is renamed into place at the end; any failure or
interrupt (SIGTERM included, via the CLI) removes the temporary directory.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sys
from collections import defaultdict
from fnmatch import fnmatchcase
from pathlib import Path

import torch

from vllm_blockfp8 import reference as ref
from vllm_blockfp8.tools.checkpoint import (DTYPE_BYTES, INDEX_NAME, CheckpointError, Progress, ShardWriter,
                                            SourceReader, check_destination, commit, copy_side_files,
                                            read_config, scan_sources)

FORMATS = ("fp8-block", "nvfp4")
REPORT_NAME = "quantization_report.json"
DEFAULT_MAX_SHARD_BYTES = 2 * 10**9
CHUNK_ELEMENTS = 1 << 22  # 16 MB per fp32 temporary; the reference makes a handful per chunk
NVFP4_INPUT_SCALE = 1.0
_QUANT_DTYPES = ("BF16", "F16", "F32")
_TARGET_PATTERNS = ("*_proj", "*_proj_with_mqa", "*.experts.*")
# Checkpoint modules vLLM loads into one fused layer (they must agree on quantization, and for
# NVFP4 share one global scale).
_FUSED = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up",
          "w1": "w13", "w3": "w13", "q_a_proj": "qkv_a", "kv_a_proj_with_mqa": "qkv_a"}


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def is_target(name: str, shape: tuple) -> bool:
    """Whether a tensor is a decoder-layer linear weight this tool quantizes."""
    if not (name.startswith("model.layers.") and name.endswith(".weight") and len(shape) == 2):
        return False
    module = name[: -len(".weight")]
    return any(fnmatchcase(module, p) for p in _TARGET_PATTERNS)


def scale_group(module: str) -> str:
    """The fused layer a module loads into (NVFP4 siblings share its global scale)."""
    parent, _, leaf = module.rpartition(".")
    return f"{parent}.{_FUSED[leaf]}" if leaf in _FUSED else module


def layer_group(module: str) -> str:
    """The vLLM layer whose quantization must be all-or-nothing (a whole MoE block for experts)."""
    if ".experts." in module:
        return module[: module.index(".experts.") + len(".experts")]
    return scale_group(module)


def _outputs(t, fmt: str, quantize: bool) -> list:
    """(name, safetensors dtype, shape) of what one source tensor becomes."""
    if not quantize:
        return [(t.name, t.dtype, t.shape)]
    (n, k), module = t.shape, t.name[: -len(".weight")]
    if fmt == "fp8-block":
        return [(t.name, "F8_E4M3", (n, k)),
                (f"{module}.weight_scale_inv", "F32", (-(-n // ref.BLOCK), -(-k // ref.BLOCK)))]
    return [(t.name, "U8", (n, k // 2)), (f"{module}.weight_scale", "F8_E4M3", (n, k // ref.NVFP4_GROUP)),
            (f"{module}.weight_scale_2", "F32", ()), (f"{module}.input_scale", "F32", ())]


def make_plan(tensors: list, fmt: str, ignore) -> tuple:
    """Decide per tensor; refuse what vLLM could not load. Returns (decisions, warnings)."""
    ignore = list(ignore)
    matched = set()
    decisions, warnings, bad = [], [], []
    for t in tensors:
        if len(t.shape) == 3 and t.name.startswith("model.layers.") and ".experts." in t.name:
            raise CheckpointError(f"{t.name} {list(t.shape)}: experts stored as one 3-D tensor are not "
                                  "supported; save the model with one 2-D weight per expert")
        target = is_target(t.name, t.shape)
        hits = [p for p in ignore if fnmatchcase(t.name[: -len(".weight")], p) or fnmatchcase(t.name, p)]
        matched.update(hits)
        quantize = target and not hits
        if quantize and t.dtype not in _QUANT_DTYPES:
            raise CheckpointError(f"{t.name} is {t.dtype}; only BF16/FP16/FP32 weights can be quantized "
                                  "(is SRC already quantized?)")
        if quantize and fmt == "nvfp4" and t.shape[1] % (2 * ref.NVFP4_GROUP):
            bad.append(f"{t.name} {list(t.shape)}")
        decisions.append((t, target, quantize))
    if bad:
        raise CheckpointError(f"nvfp4 needs K % 32 == 0; {len(bad)} weight(s) do not fit, e.g. "
                              f"{', '.join(bad[:3])} (use --ignore for them or --format fp8-block)")
    unused = [p for p in ignore if p not in matched]
    if unused:
        warnings.append(f"--ignore pattern(s) matched nothing: {', '.join(unused)}")
    groups = defaultdict(set)
    for t, target, quantize in decisions:
        if target:
            groups[layer_group(t.name[: -len(".weight")])].add(quantize)
    mixed = sorted(g for g, q in groups.items() if len(q) > 1)
    if mixed:
        raise CheckpointError(f"--ignore matches part of a layer vLLM loads as one ({mixed[0]}: q/k/v, "
                              "gate/up or all experts of a MoE block); ignore all of its parts or none")
    if fmt == "fp8-block":
        ragged = [t.name for t, _, q in decisions if q and (t.shape[0] % ref.BLOCK or t.shape[1] % ref.BLOCK)]
        if ragged:
            warnings.append(f"{len(ragged)} weight(s) have N or K not a multiple of 128 (e.g. {ragged[0]}): "
                            "the format stores them, but vLLM refuses such fused or tensor-parallel layers")
    return decisions, warnings


def _exclusions(decisions) -> list:
    """Modules left unquantized that vLLM might otherwise build as quantized linears."""
    kept = {t.name[: -len(".weight")] for t, _, q in decisions
            if not q and t.name.endswith(".weight") and len(t.shape) == 2}
    return sorted(kept | {"lm_head"})


def _quant_config(fmt: str, exclude: list) -> tuple:
    """(config.json quantization_config, hf_quant_config.json content or None)."""
    if fmt == "fp8-block":
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": [ref.BLOCK, ref.BLOCK], "modules_to_not_convert": exclude}, None
    return ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": ref.NVFP4_GROUP,
             "kv_cache_quant_algo": None, "ignore": exclude, "exclude_modules": exclude, "producer": _producer()},
            {"producer": _producer(), "quantization": {"quant_algo": "NVFP4", "group_size": ref.NVFP4_GROUP,
                                                       "exclude_modules": exclude, "kv_cache_quant_algo": None}})


def _producer() -> dict:
    from vllm_blockfp8.tools import package_version

    # vLLM keys ModelOpt handling on the producer name; we claim the format, not a ModelOpt version.
    return {"name": "modelopt", "converter": f"vllm_blockfp8 quantize {package_version()}"}


def _chunk_rows(k: int) -> int:
    return max(ref.BLOCK, CHUNK_ELEMENTS // max(k, 1) // ref.BLOCK * ref.BLOCK)


def _nvfp4_chunk(w: torch.Tensor, group_amax: float):
    """reference.quantize_nvfp4 with the global scale of the fused group, not of w alone.

    The reference derives global_scale = amax / 2688 from its input; one extra row holding the
    group amax makes it derive the group's scale. Rows are quantized independently, so dropping
    that row leaves exactly the bytes a reference taking the scale as input would give.
    """
    extra = torch.zeros(1, w.shape[1], dtype=torch.float32)
    extra[0, 0] = group_amax
    packed, scale, global_scale = ref.quantize_nvfp4(torch.cat([w.float(), extra]))
    return packed[:-1], scale[:-1], global_scale


class _ErrorStats:
    """Accumulates rms(w_deq - w) / rms(w) and max|w_deq - w| / max|w| over row chunks."""

    def __init__(self):
        self.se = self.sw = self.max_err = self.max_w = 0.0

    def add(self, w: torch.Tensor, w_deq: torch.Tensor) -> None:
        w = w.float()
        d = w_deq.float() - w
        self.se += float(d.square().sum(dtype=torch.float64))
        self.sw += float(w.square().sum(dtype=torch.float64))
        self.max_err = max(self.max_err, float(d.abs().max()))
        self.max_w = max(self.max_w, float(w.abs().max()))

    def result(self) -> dict:
        return {"rms_rel": math.sqrt(self.se / self.sw) if self.sw else 0.0,
                "max_rel": self.max_err / self.max_w if self.max_w else 0.0}


def _group_amax(reader, decisions, progress: bool) -> dict:
    """Pass 1 for NVFP4: amax of every fused group."""
    amax = defaultdict(float)
    todo = [t for t, _, q in decisions if q]
    bar = Progress(sum(t.nbytes for t in todo), "nvfp4 amax pass", progress)
    for t in todo:
        for chunk in reader.rows(t, _chunk_rows(t.shape[1])):
            key = scale_group(t.name[: -len(".weight")])
            amax[key] = max(amax[key], float(chunk.float().abs().amax()))
            bar.update(chunk.numel() * chunk.element_size())
    bar.close()
    return amax


def _write_quantized(reader, writer, t, fmt: str, amax: dict, bar) -> dict:
    stats, scales = _ErrorStats(), []
    global_scale = None
    for chunk in reader.rows(t, _chunk_rows(t.shape[1])):
        if fmt == "fp8-block":
            q, s = ref.quantize_block_fp8(chunk)
            stats.add(chunk, ref.dequantize_block_fp8(q, s))
        else:
            q, s, global_scale = _nvfp4_chunk(chunk, amax[scale_group(t.name[: -len(".weight")])])
            stats.add(chunk, ref.dequantize_nvfp4(q, s, global_scale))
        writer.write(q)
        scales.append(s)
        bar.update(chunk.numel() * chunk.element_size())
    writer.write(torch.cat(scales))
    if fmt == "nvfp4":
        writer.write(global_scale.reshape(()).float())
        writer.write(torch.tensor(NVFP4_INPUT_SCALE, dtype=torch.float32))
    return {"name": t.name[: -len(".weight")], "shape": list(t.shape), **stats.result()}


def _shards(items: list, max_bytes: int) -> list:
    """Split (decision, outputs) items in order into shards of at most ~max_bytes."""
    shards, current, size = [], [], 0
    for item in items:
        nbytes = sum(math.prod(s) * DTYPE_BYTES[d] for _, d, s in item[1])
        if current and size + nbytes > max_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(item)
        size += nbytes
    if current:
        shards.append(current)
    return shards


def _write_all(tmp, decisions, fmt, max_shard_bytes, progress) -> tuple:
    items = [(d, _outputs(d[0], fmt, d[2])) for d in decisions]
    names = [n for _, outs in items for n, _, _ in outs]
    if len(set(names)) != len(names):
        raise CheckpointError("SRC already holds tensors named like our scales (is it already quantized?)")
    shards = _shards(items, max_shard_bytes)
    total_out = sum(math.prod(s) * DTYPE_BYTES[d] for _, outs in items for _, d, s in outs)
    free = shutil.disk_usage(tmp).free
    if free < total_out:
        raise CheckpointError(f"not enough disk space beside DST: need {total_out / 1e9:.2f} GB, "
                              f"{free / 1e9:.2f} GB free")
    weight_map, layers = {}, []
    with SourceReader() as reader:
        amax = _group_amax(reader, decisions, progress) if fmt == "nvfp4" else {}
        bar = Progress(sum(t.nbytes for t, _, _ in decisions), f"quantize {fmt}", progress)
        for i, shard in enumerate(shards):
            fname = "model.safetensors" if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            with ShardWriter(tmp / fname, [o for _, outs in shard for o in outs]) as writer:
                for (t, _, quantize), outs in shard:
                    weight_map.update({n: fname for n, _, _ in outs})
                    if quantize:
                        layers.append(_write_quantized(reader, writer, t, fmt, amax, bar))
                        continue
                    for chunk in reader.rows(t, max(1, CHUNK_ELEMENTS // max(1, math.prod(t.shape[1:])))):
                        writer.write(chunk)
                        bar.update(chunk.numel() * chunk.element_size())
        bar.close()
    index = {"metadata": {"total_size": total_out}, "weight_map": dict(sorted(weight_map.items()))}
    (tmp / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
    return layers, len(shards)


def quantize_checkpoint(src, dst, *, fmt: str = "fp8-block", ignore=(), overwrite: bool = False,
                        max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES, progress: bool = True) -> dict:
    """Quantize SRC into DST; returns the report (also written to DST/quantization_report.json).

    Raises CheckpointError (nothing written) for a bad SRC, an existing DST, or shapes vLLM cannot
    run; any other failure also leaves DST untouched and removes the temporary directory.
    """
    if fmt not in FORMATS:
        raise CheckpointError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    src, dst = Path(src).resolve(), Path(os.path.abspath(dst))
    config = read_config(src)
    if config.get("quantization_config"):
        raise CheckpointError(f"SRC {src} is already quantized (config.json has quantization_config)")
    decisions, warnings = make_plan(scan_sources(src), fmt, ignore)
    if not any(q for _, _, q in decisions):
        raise CheckpointError(f"SRC {src}: no decoder-layer linear weights to quantize "
                              "(expected model.layers.*.*_proj.weight)")
    check_destination(src, dst, overwrite)
    for w in warnings:
        _log(f"warning: {w}")
    stale = sorted(p.name for p in dst.parent.glob(f".{dst.name}.tmp-*")) if dst.parent.is_dir() else []
    if stale:
        _log(f"warning: leftover temporary directories from killed runs beside DST: {', '.join(stale)}")
    tmp = dst.parent / f".{dst.name}.tmp-{os.getpid()}"
    try:
        tmp.mkdir(parents=True)
    except OSError as e:
        raise CheckpointError(f"cannot create {tmp}: {e}") from None
    try:
        layers, n_shards = _write_all(tmp, decisions, fmt, max_shard_bytes, progress)
        exclude = _exclusions(decisions)
        qcfg, hf_quant = _quant_config(fmt, exclude)
        copied = copy_side_files(src, tmp)
        (tmp / "config.json").write_text(json.dumps({**config, "quantization_config": qcfg}, indent=2) + "\n")
        if hf_quant is not None:
            (tmp / "hf_quant_config.json").write_text(json.dumps(hf_quant, indent=2) + "\n")
        report = {"format": fmt, "src": str(src), "shards": n_shards, "copied_files": copied,
                  "not_quantized": exclude, "warnings": warnings,
                  "nvfp4_input_scale": NVFP4_INPUT_SCALE if fmt == "nvfp4" else None, "layers": layers}
        (tmp / REPORT_NAME).write_text(json.dumps(report, indent=2) + "\n")
        check_destination(src, dst, overwrite)
        commit(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return report


def format_report(report: dict) -> str:
    """One line per decoder layer (its worst tensor), then the totals; the JSON has every tensor."""
    by_layer = defaultdict(list)
    for row in report["layers"]:
        m = re.match(r"model\.layers\.(\d+)\.", row["name"])
        by_layer[int(m.group(1)) if m else -1].append(row)
    lines = [f"{'layer':>5}  {'tensors':>7}  {'worst rms_rel':>13}  {'worst max_rel':>13}  worst tensor"]
    for idx in sorted(by_layer):
        rows = by_layer[idx]
        worst = max(rows, key=lambda r: r["rms_rel"])
        lines.append(f"{idx:>5}  {len(rows):>7}  {worst['rms_rel']:>13.3e}  "
                     f"{max(r['max_rel'] for r in rows):>13.3e}  {worst['name']}")
    rows = report["layers"]
    lines.append(f"{len(rows)} weights quantized to {report['format']} in {report['shards']} shard(s); "
                 f"mean rms_rel {sum(r['rms_rel'] for r in rows) / max(len(rows), 1):.3e}, "
                 f"worst max_rel {max((r['max_rel'] for r in rows), default=0.0):.3e}; "
                 f"left unquantized: {len(report['not_quantized'])} module(s)")
    return "\n".join(lines)
