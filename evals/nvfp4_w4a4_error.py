"""W4A4 vs W4A16 error of NVFP4 on Qwen3-8B-shaped layers, through the reference emulation (CPU, no model).

What the SM120 native path changes numerically: it quantizes the activations to NVFP4 too (16-value groups,
e4m3 scales, the checkpoint's input_scale as the global scale). This measures, per layer shape and activation
distribution, the relative Frobenius error against the unquantized product x @ w^T (float64, x in bf16):

  w4a16  x @ dequant(nvfp4(w))^T                                   (what Hopper/Ada and SM120 decode run)
  w4a4   dequant(nvfp4(x; input_scale)) @ dequant(nvfp4(w))^T      (the native GEMM's exact math)

Both products are exact in float64 (reference.nvfp4_linear_ref / nvfp4_w4a4_linear_ref); kernel accumulation
and the bf16 output rounding (2^-9 relative) are far below these errors, so this is the quantization error
alone. Weights: Gaussian * 0.02 with a Student-t(5) tail. Activations (M tokens, bf16):
  gaussian          N(0, 1)
  heavy_tailed      Student-t(3) values, each row scaled by a log-normal(0, 1) magnitude
  outlier_channels  N(0, 1) plus 8 fixed channels of K at 30-100x (LLM "massive activation" channels)
input_scale: "calibrated" = amax of a separate calibration batch of the same distribution / (6 * 448), as
ModelOpt exports it; "placeholder" = 1.0 (what `blockfp8 quantize` writes without calibration data).

    python -m evals.nvfp4_w4a4_error [--m 128] [--seed 0] [--json out.json]

Synthetic data: these are not model-level (perplexity, task) numbers.
"""

from __future__ import annotations

import argparse
import json

import torch

from vllm_blockfp8 import reference

# Qwen3-8B: hidden 4096, 32 q heads + 8 kv heads of 128, intermediate 12288 (N x K).
LAYERS = (("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 24576, 4096), ("down", 4096, 12288))
DISTRIBUTIONS = ("gaussian", "heavy_tailed", "outlier_channels")


def activations(kind: str, m: int, k: int, g: torch.Generator) -> torch.Tensor:
    if kind == "gaussian":
        x = torch.randn(m, k, generator=g)
    elif kind == "heavy_tailed":
        x = _student_t(3.0, (m, k), g) * torch.exp(torch.randn(m, 1, generator=g))
    elif kind == "outlier_channels":
        x = torch.randn(m, k, generator=g)
        chans = torch.randperm(k, generator=torch.Generator().manual_seed(k))[:8]  # fixed per K, as in a model
        x[:, chans] *= 30 + 70 * torch.rand(1, 8, generator=torch.Generator().manual_seed(k + 1))
    else:
        raise ValueError(kind)
    return x.to(torch.bfloat16)


def _student_t(df: float, shape, g: torch.Generator) -> torch.Tensor:
    # t = z / sqrt(chi2_df / df), chi2 from a sum of squared normals (df integer here): seeded by g.
    z = torch.randn(*shape, generator=g)
    chi2 = sum(torch.randn(*shape, generator=g) ** 2 for _ in range(int(df)))
    return z / torch.sqrt(chi2 / df)


def weights(n: int, k: int, g: torch.Generator) -> torch.Tensor:
    return (0.02 * _student_t(5.0, (n, k), g)).to(torch.bfloat16)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return (torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b)).item()


def measure(m: int, seed: int) -> list:
    rows = []
    for name, n, k in LAYERS:
        g = torch.Generator().manual_seed(seed + n + k)
        w = weights(n, k, g)
        packed, scale, gs = reference.quantize_nvfp4(w)
        w_deq = reference.dequantize_nvfp4(packed, scale, gs)  # fp32, exact
        for kind in DISTRIBUTIONS:
            x = activations(kind, m, k, g)
            calib = activations(kind, m, k, g)
            exact = x.double() @ w.double().t()
            w4a16 = x.double() @ w_deq.double().t()
            for label, isc in (("calibrated", (calib.float().abs().amax() / 2688).reshape(1)),
                               ("placeholder", torch.ones(1))):
                qa, sa = reference.quantize_nvfp4_activations(x, isc)
                x_deq = reference.dequantize_nvfp4(qa, sa, isc)
                w4a4 = x_deq.double() @ w_deq.double().t()
                rows.append({"layer": name, "n": n, "k": k, "m": m, "activations": kind, "input_scale": label,
                             "w4a16_vs_exact": rel(w4a16, exact), "w4a4_vs_exact": rel(w4a4, exact),
                             "w4a4_vs_w4a16": rel(w4a4, w4a16), "x_quant_error": rel(x_deq.double(), x.double())})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--m", type=int, default=128, help="tokens per layer (default 128)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="also write the rows as JSON here")
    args = ap.parse_args()
    rows = measure(args.m, args.seed)
    print(f"{'layer':8} {'activations':17} {'input_scale':12} {'x quant':>8} {'W4A16':>8} {'W4A4':>8} {'W4A4/W4A16':>10}")
    for r in rows:
        print(f"{r['layer']:8} {r['activations']:17} {r['input_scale']:12} {r['x_quant_error']:8.4f} "
              f"{r['w4a16_vs_exact']:8.4f} {r['w4a4_vs_exact']:8.4f} {r['w4a4_vs_exact'] / r['w4a16_vs_exact']:10.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
