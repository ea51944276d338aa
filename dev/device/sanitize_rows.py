"""One small forced call per tile row, for compute-sanitizer on the GPU machine.

    compute-sanitizer --tool memcheck  python dev/device/sanitize_rows.py
    compute-sanitizer --tool racecheck python dev/device/sanitize_rows.py
    compute-sanitizer --tool racecheck python dev/device/sanitize_rows.py gemm:sm90_coop --case 1
    compute-sanitizer --tool memcheck  python dev/device/sanitize_rows.py gemm --table sm89

Arguments (optional): FAMILY[:ROW] prefixes select rows (a full FAMILY:ROW name selects that row
only, not the rows whose names extend it, e.g. gemm:sm90_swapab_128x32x128 vs its _ovl candidate);
--case I runs only the I-th case of each, so a hazard report can be tied to one launch. --table sm89 forces that
W8A8 GEMM table for the process (ops.set_gemm_table: the SM89 rows run on the H200 from their sm_90a code) and adds
its ragged cases: M one short of and past each row's token tile, odd N (the element-by-element store).

Covers every row of tile_table("quant"), tile_table("gemv"), tile_table("nvfp4") (the weight-only NVFP4 rows:
GEMVs, the mma.sync and, on SM90, the wgmma W4A16 GEMMs; each case in every packing the row reads: fragment (N
rounded up to a multiple of 16), paired, ModelOpt's) and, where this GPU has one, tile_table("gemm"). Shapes are ragged on
purpose (N not a multiple of 16 or 128, K with a partial last 128-block, M not a multiple of a row's token tile) so
the edge guards run. A GEMV tensor-core row chooses among entry points inside its launcher (8- or 16-warp K split,
residency-pinned), so it runs once per entry point. Each output is checked against the reference too, so a silent wrong answer fails.
Prints one line per row; exits non-zero if any call failed.
"""

from __future__ import annotations

import argparse
import sys

import torch

from vllm_blockfp8 import ops, reference


def _gemv_cases(row: dict, sm_count: int):
    m = row["max_m"] if row["max_m"] is not None else 19
    # 16 * SMs - 5 columns: a ragged grid of one tile per SM (rows limited to small grids), K = 6144
    # in whole 128-byte lines, 3 per warp (the _lines row).
    cases = [(m, 4104, 320), (m, 4104, 208), (m, 8200, 192), (m, 16 * sm_count - 5, 6144)]
    pinned_n = 16 * (2 * sm_count + 1) + 5
    if pinned_n < 8192:
        cases.append((min(m, 8), pinned_n, 256))
    return cases


def _quant_cases(row: dict):
    # n is unused; K = 640 leaves a partial tile of groups for rows that take several per lane.
    return [(83, 0, 640), (1500, 0, 4096)]


def _gemm_cases(row: dict):
    m = row["max_m"] if row["max_m"] is not None else 300
    # Case 2: K = 12288 (96 blocks) on a 2-wide weight grid: the swap rows take their stream-K
    # decomposition there (k / 128 >= 96 and 2 * tiles < SMs; partial tiles, workspace fixup).
    # Case 3: 56 K blocks on 17 weight tiles: the swap rows split each tile 3 ways (19 + 19 + 18
    # blocks, partials reduced through the workspace); the 128x128 row runs it data-parallel.
    cases = [(m, 4096, 1024), (m, 520, 384), (m, 256, 12288), (m, 2112, 7168)]
    if row["max_m"] is None:
        # Case 4: ~4 tiles per CTA (8 x 65 tiles, ragged M and N, 4 K blocks): the persistent rows' tile change
        # runs, where the issue-ahead rows start the next tile's first block before the epilogue.
        cases.append((1000, 8200, 512))
    if row["name"].startswith("sm90_tok64"):
        # Its widths past 128 (144 / 160 / 192 at M = 128; 6-7 stages, so 8 K blocks wrap the ring), ragged N;
        # then 48 / 80 / 96, the other selected widths whose tiles straddle scale blocks.
        cases += [(m, 9208, 1024), (m, 10232, 1024), (m, 11000, 1024), (m, 3064, 1024), (m, 5112, 1024),
                  (m, 6136, 1024)]
    return cases


def _sm89_gemm_cases(row: dict):
    # M ragged against the row's token tile (tile - 5, tile + 3, and 300 = 2 x 128 + 44), N odd (no pair stores) or
    # past a 128-row weight tile by 8, K = 384 (3 blocks: K slices at small M) and 7168 (56 blocks).
    tile = row["max_m"] or 128
    return [(tile - 5, 523, 384), (tile + 3, 2120, 7168), (300, 4104, 1024), (1, 257, 12288)]


def _nvfp4_cases(row: dict):
    # M at the row's bound (or past a 64/128/256-token tile), N ragged against 16, 64 and 128 (4360: > 2 16-row
    # tiles per SM on 132 SMs, so the wide-layer GEMV rows take it), K of 2 and 56
    # 128-blocks; the second case leaves the K-splitting rows few tiles (their partials and the reduce run).
    # Each in every packing (the packings take different decode code; a row that does not read one is skipped):
    # the fragment packing needs N % 16 == 0, so its N is rounded up (still ragged against 64 and 128).
    m = row["max_m"] if row["max_m"] is not None else 300
    return [(m_, n + (-n % 16 if packing == "fragment" else 0), k, packing)
            for m_, n, k in ((m, 1000, 256), (m, 520, 7168), (min(m, 77), 4360, 1024))
            for packing in ops.NVFP4_PACKINGS]


def _label(case: tuple) -> str:
    label = "x".join(map(str, case[:3]))
    return label if len(case) == 3 else f"{label}/{case[3]}"


def _run(family: str, row: dict, m: int, n: int, k: int, packing: str = "fragment") -> str:
    g = torch.Generator(device="cuda").manual_seed(m * 7 + n * 13 + k)
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    if family == "quant":  # bit-exact, not close: compare every byte
        q, s = ops.per_token_group_quant(x, 128, row=row["name"])
        torch.cuda.synchronize()
        # The contract is the CPU reference (IEEE fp32 division, as tests/test_quant.py uses):
        # evaluated on the GPU, torch's elementwise path differed from it by one fp8 code at one
        # element of 83x640 on the H200 (2026-11-30), so the GPU-side reference is not bit-exact.
        q_ref, s_ref = reference.quantize_per_token_group(x.cpu(), 128)
        bad = reference.first_mismatch(q, q_ref) or reference.first_mismatch(s.cpu().contiguous(), s_ref)
        if bad:
            raise AssertionError(f"quant {row['name']} M={m} K={k}: {bad}")
        return "ok"
    if family == "nvfp4":
        packed, scale, gs = reference.quantize_nvfp4(torch.randn(n, k, device="cuda", generator=g))
        b, b_scale = packed, scale
        if packing == "paired":
            b = ops.pair_nvfp4_weight(packed)
        elif packing == "fragment":
            b, b_scale = ops.fragment_nvfp4_weight(packed, scale)
        try:
            out = ops.nvfp4_linear(x, b, b_scale, gs.reshape(1), None, row=row["name"], packing=packing)
            torch.cuda.synchronize()
        except (RuntimeError, ValueError) as exc:
            if "cannot run" in str(exc):
                return "skip"
            raise
        reference.assert_nvfp4_row_close(out, x, packed, scale, gs.reshape(1), None, row["name"],
                                         f"nvfp4 {row['name']} M={m} N={n} K={k} {packing}")
        return "ok"
    b, bs = reference.quantize_block_fp8(torch.randn(n, k, device="cuda", generator=g))
    try:
        if family == "gemv":
            out = ops.blockfp8_gemv(x, b, bs, row=row["name"])
            ref = reference.gemv_ref(x, b, bs)
        else:
            a, a_scale = ops.per_token_group_quant(x, 128)
            out = ops.blockfp8_gemm(a, a_scale, b, bs, torch.bfloat16, row=row["name"])
            ref = reference.gemm_ref(a, a_scale, b, bs)
        torch.cuda.synchronize()
    except (RuntimeError, ValueError) as exc:
        if "cannot run" in str(exc):
            return "skip"
        raise
    reference.assert_close_to_ref(out, ref, f"{family} {row['name']} M={m} N={n} K={k}")
    return "ok"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("only", nargs="*", metavar="FAMILY[:ROW]", help="run only rows with these prefixes")
    parser.add_argument("--case", type=int, help="run only this case (index) of each row")
    parser.add_argument("--table", choices=("auto", "sm89", "sm90", "sm120"), default="auto",
                        help="force this W8A8 GEMM table (sm89 adds its ragged cases)")
    args = parser.parse_args(argv)
    only, case = args.only, args.case
    if not (torch.cuda.is_available() and ops.HAS_CUDA_KERNELS):
        print("sanitize_rows: needs a CUDA GPU and the compiled extension", file=sys.stderr)
        return 2
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    if args.table != "auto":
        ops.set_gemm_table(args.table)
        built = [r["name"] for r in ops.gemm_table_rows(args.table)]
        got = [r["name"] for r in ops.tile_table("gemm")]
        if not built or got != built:  # a forced table this GPU or build cannot run: say so, never test another
            print(f"sanitize_rows: the {args.table} GEMM table is not in force here (built rows {built}, "
                  f"tile_table('gemm') {got})", file=sys.stderr)
            return 2
    failed = 0
    tables = {family: ops.tile_table(family) for family in ("quant", "gemv", "nvfp4", "gemm")}
    full_names = {f"{family}:{row['name']}" for family, rows in tables.items() for row in rows}

    def selected(name: str) -> bool:
        return not only or any(name == o if o in full_names else name.startswith(o) for o in only)

    for family, rows in tables.items():
        for row in rows:
            if not selected(f"{family}:{row['name']}"):
                continue
            cases = {"quant": _quant_cases(row), "gemv": _gemv_cases(row, sm_count),
                     "nvfp4": _nvfp4_cases(row)}.get(family) or (
                _sm89_gemm_cases(row) if args.table == "sm89" else _gemm_cases(row))
            if case is not None:
                cases = [cases[case]] if case < len(cases) else []
            ran, skipped = [], []
            try:
                for one in cases:
                    (ran if _run(family, row, *one) == "ok" else skipped).append(_label(one))
                status = "ok" if ran else "NOT RUN"
                failed += not ran
            except Exception as exc:  # keep going: one line per row, every row reported
                status = f"FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                failed += 1
            print(f"{family} {row['name']}: {status}; ran {' '.join(ran) or '-'}; "
                  f"skipped {' '.join(skipped) or '-'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
