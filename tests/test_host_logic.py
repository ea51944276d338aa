"""Host-only logic of the compiled extension: runs wherever the extension was built (CI builds it
without a GPU), so these checks do not wait for a GPU machine."""

import os
import subprocess
import sys

import pytest
import torch

from vllm_blockfp8 import ops

pytestmark = pytest.mark.skipif(not ops.HAS_CUDA_KERNELS,
                                reason="needs the compiled extension vllm_blockfp8._C (installed without nvcc)")


def test_residency_predicate_at_132_sms():
    """Pure host logic, at the H200's SM count so the expectations do not move with the GPU."""
    pins = ops.gemv_pins_residency
    assert not pins(264, 132, 16, 1), "2 blocks per SM is already one wave"
    assert pins(265, 132, 16, 1)
    assert pins(396, 132, 16, 1)
    assert not pins(397, 132, 16, 1), "past 3 blocks per SM stays multi-wave"
    assert not pins(300, 132, 8, 1), "8-warp blocks lose from any explicit launch bounds"
    assert not pins(300, 132, 16, 2), "two token tiles spill under the 40-register cap"
    assert not pins(1, 0, 16, 1)


def test_build_info_names_the_compiled_archs():
    info = ops.build_info()
    assert info["compiled"] is True and info["archs"], info
    assert set(info["families"]) == {"quant", "gemv", "nvfp4", "gemm", "nvfp4_native"}
    assert info["families"]["nvfp4_native"] == (["sm120"] if "12.0a" in info["archs"] else []), info
    assert info["families"]["nvfp4"] == "all", info
    assert ("sm90" in info["families"]["gemm"]) == ("9.0a" in info["archs"]), info
    assert ("sm120" in info["families"]["gemm"]) <= ("12.0a" in info["archs"]), info


def test_quant_table_lists_its_row_with_the_measured_reason():
    """The quant table is arch-independent, so it is listed (and selected from) without a GPU."""
    rows = ops.tile_table("quant")
    assert [r["name"] for r in rows] == ["quant_lane16_rcp"], rows
    assert rows[0]["max_m"] is None, "the only row must take every M"
    assert "71% of copy" in rows[0]["reason"] and "2.13x" in rows[0]["reason"], rows[0]


@pytest.mark.parametrize("k", [128, 640, 7168])
def test_quant_default_selects_row_0_for_every_m(k):
    for m in (0, 1, 3, 16, 83, 1024, 1500, 65535 * 16 + 1, 1 << 24):
        assert ops.selected_row("quant", m, 0, k) == "quant_lane16_rcp", (m, k)


def test_quant_row_rejects():
    rejects = torch.ops.blockfp8.row_rejects
    for row in range(len(ops.tile_table("quant"))):
        assert rejects("quant", row, 83, 0, 640, 0, 640) == ""
        assert rejects("quant", row, 83, 0, 640, 1 << 20, 0) == "", "broadcast rows (stride 0) read in place"
        assert "16-byte aligned" in rejects("quant", row, 83, 0, 640, 8, 640)
        assert "16-byte aligned" in rejects("quant", row, 83, 0, 640, 0, 644)
        assert rejects("quant", row, 1, 0, 640, 0, 3) == "", "one row: its stride is never used"
        assert "multiple of 128" in rejects("quant", row, 4, 0, 200, 0, 200)
        assert rejects("quant", row, 5, 0, 0, 8, 1) == "", "K = 0 reads nothing (torch gives [5, 0] stride 1)"
    assert rejects("quant", len(ops.tile_table("quant")), 4, 0, 128, 0, 128) == "row out of range"


def test_sm90_switches_are_checked_at_import_values():
    ops.check_env({})
    ops.check_env({"BLOCKFP8_SM90_RASTER": "along_n", "BLOCKFP8_SM90_SWIZZLE": "8"})
    ops.check_env({"BLOCKFP8_SM90_RASTER": ""})
    ops.check_env({"BLOCKFP8_SM90_SPLITS": "3", "BLOCKFP8_SM90_REDUCTION": "nondeterministic"})
    ops.check_env({"BLOCKFP8_SM90_FP4_REDUCTION": "partials", "BLOCKFP8_SM90_FP4_SPLITS": "16"})
    for pdl in ("0", "1", "gemm"):
        ops.check_env({"BLOCKFP8_SM90_PDL": pdl})
    ops.check_env({"BLOCKFP8_SM90_TILE_N": "96"})
    for name, bad in (("RASTER", "alongn"), ("SWIZZLE", "3"), ("SPLITS", "5"), ("REDUCTION", "fast"),
                      ("FP4_SPLITS", "17"), ("FP4_REDUCTION", "atomic"),
                      ("PDL", "off"), ("TILE_N", "100")):
        with pytest.raises(ValueError, match=f"BLOCKFP8_SM90_{name}='{bad}'"):
            ops.check_env({f"BLOCKFP8_SM90_{name}": bad})


def test_user_switches_are_checked_at_import_values():
    """A typo in a documented switch fails at import with its name (it was silently ignored)."""
    ops.check_env({"BLOCKFP8_SELF_CHECK": "always", "BLOCKFP8_NVFP4_W4A16": "1", "BLOCKFP8_LOG_ROWS": "0"})
    ops.check_env({"BLOCKFP8_SELF_CHECK": "inprocess"})
    for name, bad in (("BLOCKFP8_SELF_CHECK", "alway"), ("BLOCKFP8_NVFP4_W4A16", "yes"), ("BLOCKFP8_LOG_ROWS", "on")):
        with pytest.raises(ValueError, match=f"{name}='{bad}': expected one of"):
            ops.check_env({name: bad})
    res = subprocess.run([sys.executable, "-c", "import vllm_blockfp8.ops"], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, BLOCKFP8_SELF_CHECK="allways"))
    assert res.returncode != 0 and "BLOCKFP8_SELF_CHECK='allways'" in res.stderr


def test_gemm_table_switch_round_trips_and_rejects_unknown_tables():
    """set_gemm_table returns the setting it replaced; the environment variable is checked at import."""
    ops.check_env({"BLOCKFP8_GEMM_TABLE": "sm89"})
    with pytest.raises(ValueError, match="BLOCKFP8_GEMM_TABLE='sm80'"):
        ops.check_env({"BLOCKFP8_GEMM_TABLE": "sm80"})
    start = ops.set_gemm_table("auto")
    try:
        assert ops.set_gemm_table("sm89") == "auto"
        with pytest.raises(ValueError, match="table must be one of auto, sm89, sm90, sm120, none, got 'sm100'"):
            ops.set_gemm_table("sm100")
        assert ops.set_gemm_table("none") == "sm89"
        assert ops.set_gemm_table("sm89") == "none"
        with ops.gemm_table("sm120"):
            assert ops.set_gemm_table("sm120") == "sm120"
        assert ops.set_gemm_table("auto") == "sm89", "the block must restore the table before it"
    finally:
        ops.set_gemm_table(start)


@pytest.mark.parametrize("table,arch", [("sm89", "8.9"), ("sm90", "9.0a"), ("sm120", "12.0a")])
def test_every_gemm_table_answers_without_a_gpu(table, arch):
    """A table the build has lists its rows and plans by name; one it lacks answers [] / None, not an error."""
    rows = ops.gemm_table_rows(table)
    built = table in ops.build_info()["families"]["gemm"]
    assert built <= (arch in ops.build_info()["archs"])
    if not built:
        assert rows == [] and ops.gemm_table_plan(table, 64, 4096, 4096, 132) is None
        return
    names = [r["name"] for r in rows]
    assert names and len(set(names)) == len(names) and rows[-1]["max_m"] is None, rows
    for m in (1, 17, 128, 1000, 8192):
        plan = ops.gemm_table_plan(table, m, 4096, 4096, 132)
        assert plan["row"] in names, plan
        for i, name in enumerate(names):
            assert ops.gemm_table_plan(table, m, 4096, 4096, 132, row=i)["row"] == name
    with pytest.raises(ValueError, match="multiple of 128"):
        ops.gemm_table_plan(table, 64, 4096, 4100, 132)


@pytest.mark.skipif("9.0a" not in ops.build_info().get("archs", []) if ops.HAS_CUDA_KERNELS else True,
                    reason="the SM90 GEMM is not in this build")
def test_sm90_table_by_name_is_the_gemm_k_plan():
    for m, n, k in [(1, 4096, 4096), (64, 576, 7168), (512, 24576, 1536), (4096, 7168, 18432)]:
        assert ops.gemm_table_plan("sm90", m, n, k, 132) == ops.gemm_k_plan(-1, m, n, k, sm_count=132)


def test_launch_mode_switch_round_trips_and_rejects_unknown_modes():
    """set_sm90_pdl returns the mode it replaced (ops.sm90_pdl restores it after a block)."""
    start = ops.set_sm90_pdl("1")
    try:
        assert start in ("0", "1", "gemm")
        assert ops.set_sm90_pdl("gemm") == "1"
        assert ops.set_sm90_pdl("0") == "gemm"
        with pytest.raises(ValueError, match="mode must be one of 0, 1, gemm, got 'off'"):
            ops.set_sm90_pdl("off")
        assert ops.set_sm90_pdl("0") == "0", "a rejected mode must leave the mode as it was"
        with ops.sm90_pdl("gemm"):
            assert ops.set_sm90_pdl("gemm") == "gemm"
        assert ops.set_sm90_pdl("1") == "0", "the block must restore the mode before it"
    finally:
        ops.set_sm90_pdl(start)


@pytest.mark.skipif("9.0a" not in ops.build_info()["archs"], reason="the SM90 GEMM is not in this build")
def test_launch_mode_1_launches_programmatically_only_at_short_k():
    """Mode 1 stops at K = 4096 (gemm/sm90/options.cpp kPdlMaxK: past it an early launch cost long-K GEMMs up to 1.25x);
    mode gemm launches so at every K, mode 0 nowhere."""
    want = {"1": (True, True, False), "gemm": (True, True, True), "0": (False, False, False)}
    for mode, expected in want.items():
        with ops.sm90_pdl(mode):
            got = tuple(ops.gemm_k_plan(-1, 128, 7168, k, 132)["pdl"] for k in (128, 4096, 4224))
        assert got == expected, (mode, got)


# (m, n, width) at 132 SMs: the 64-token-tile row's width rule (gemm/sm90/plan.cpp, tok64_width). At M = 128 it
# picks DeepGEMM's own widths (gemm/NOTES.md fourteenth session: 64x32 / 64x64 / 64x80 / 64x96 tiles).
TOK64_WIDTHS_AT_132_SMS = [
    (128, 2048, 32), (128, 4096, 64), (128, 5120, 80), (128, 6144, 96),
    (64, 4096, 32),   # one token tile: 128 tiles of 32 (96 B a CTA) beat 64 of 64 (128 B)
    (32, 2112, 16),   # 132 tiles of 16 fill one wave exactly
    (128, 9216, 144), (128, 10240, 160), (128, 11008, 192),  # one wave past 128 wide: 128 / 128 / 116 tiles
    (96, 24576, 192),  # no width fits one wave: 2 waves of 192 (cost 512) beat 3 of 128 (576)
    (256, 6144, 192),  # 4 token tiles: one wave of 192-wide tiles (cost 256) beats 2 of 96 (320)
    (256, 7168, 112),  # 192 would take 152 tiles: 2 waves of 112 (352) beat 2 of 128 (384) and 2 of 192 (512)
]


@pytest.mark.skipif("9.0a" not in ops.build_info().get("archs", []) if ops.HAS_CUDA_KERNELS else True,
                    reason="the SM90 GEMM is not in this build (TORCH_CUDA_ARCH_LIST without 9.0a)")
def test_sm90_tok64_width_rule_at_132_sms():
    """The fewest waves times bytes a CTA loads per K block ((64 + width) x 128), ties to the wider tile;
    data-parallel, no workspace (host logic only)."""
    row = 2  # sm90_tok64_fitn's index (test_sm90_gemm_k_plan_at_132_sms checks the names)
    assert ops.gemm_k_plan(row, 128, 4096, 4096, 132)["row"] == "sm90_tok64_fitn"
    got = [(m, n, ops.gemm_k_plan(row, m, n, 4096, 132)["tile_n"]) for m, n, _ in TOK64_WIDTHS_AT_132_SMS]
    assert got == TOK64_WIDTHS_AT_132_SMS
    plan = ops.gemm_k_plan(row, 128, 6144, 7168, 132)
    assert (plan["plan"], plan["workspace_bytes"]) == ("data-parallel", 0)
    assert ops.gemm_k_plan(row, 128, 2048, 4096, 66)["tile_n"] == 64, "half the SMs: 64 tiles of 64 in one wave"


GEMM_PLANS_AT_132_SMS = [  # (row index, m, n, k, plan), gemm/sm90/table.h order
    (1, 32, 4096, 7168, "K slices x4"),  # CUTLASS would split 3 ways here: slices replace it
    (1, 64, 4096, 7168, "K slices x2"),
    (1, 32, 2112, 7552, "split-K x3"),  # 59 K blocks: no slice count divides them
    (1, 32, 4096, 4096, "K slices x4"),  # 32 tiles, 4 slices save 18 blocks' walk
    (1, 32, 5120, 5120, "K slices x2"),  # 40 tiles, 2 slices save 18
    (1, 64, 4096, 4096, "data-parallel"),  # 64 tiles stream near DRAM's rate: 4 saved
    (1, 32, 6144, 4096, "data-parallel"),  # 48 tiles, 2 slices save 11 (< 16)
    (1, 32, 7168, 2048, "data-parallel"),
    (1, 32, 24576, 1536, "data-parallel"),  # more tiles than SMs
    (1, 32, 4096, 12288, "stream-K"),  # 96 K blocks on 32 tiles
    (6, 96, 4096, 7168, "split-K x2"),  # the 128x64 row has no slices
    (6, 96, 2112, 7168, "split-K x3"),
    (6, 96, 4096, 4096, "data-parallel"),
    (4, 96, 4096, 7168, "K slices x2"),  # its sliced twin replaces that split
    (4, 96, 2112, 7168, "K slices x2"),  # 56 K blocks: 3 slices do not divide them
    (4, 96, 4096, 4096, "data-parallel"),
    (9, 640, 4096, 7168, "stream-K"),  # 160 tiles without a cluster: the last round 28 / 132 full
    (9, 640, 4096, 4096, "data-parallel"),  # as thin, but 32 K blocks (< 48)
    (10, 1024, 2112, 7168, "stream-K"),  # 136 tiles on 132 SMs: the last wave 4 tiles full
    (10, 1024, 7168, 16384, "stream-K"),  # 448 tiles: the last wave 52 / 132 full (<= 40%)
    (10, 1024, 7168, 2048, "data-parallel"),  # as full, but 16 K blocks (< 48)
    (10, 1024, 4096, 7168, "data-parallel"),  # 256 tiles: the last wave 124 / 132 full
    (10, 300, 256, 12288, "stream-K"),  # 4 tiles (2 in clusters of 2 along M)
    (12, 1024, 2112, 7168, "data-parallel"),  # the persistent row never splits
    (8, 384, 5120, 6144, "data-parallel"),  # the row without a cluster never splits
    (7, 384, 2112, 7168, "data-parallel"),  # the tok64 kernel walks K whole at any M
    (5, 96, 4096, 7168, "data-parallel"),  # the persistent 128x64 row never splits either
]


@pytest.mark.skipif("9.0a" not in ops.build_info().get("archs", []) if ops.HAS_CUDA_KERNELS else True,
                    reason="the SM90 GEMM is not in this build (TORCH_CUDA_ARCH_LIST without 9.0a)")
def test_sm90_gemm_k_plan_at_132_sms():
    """gemm/sm90/plan.cpp's K rules (stream-K, CUTLASS split-K, K slices) at the H200's SM count,
    host logic only; the numbers in the comments are gemm/NOTES.md's (seventh session)."""
    got = [(row, m, n, k, ops.gemm_k_plan(row, m, n, k, 132)["plan"]) for row, m, n, k, _ in GEMM_PLANS_AT_132_SMS]
    assert got == GEMM_PLANS_AT_132_SMS
    names = [ops.gemm_k_plan(row, 64, 4096, 4096, 132)["row"] for row in range(13)]
    assert names == ["sm90_swapab_64x32x128_pp_ovl", "sm90_swapab_128x32x128", "sm90_tok64_fitn",
                     "sm90_swapab_64x64x128_pp_ovl",
                     "sm90_swapab_128x64x128_ovl_slicek", "sm90_swapab_128x64x128_ovl_persistent",
                     "sm90_swapab_128x64x128_ovl", "sm90_tok64_fitn_narrow", "sm90_coop_128x128x128_c1x1_ovl_epi64x3",
                     "sm90_coop_128x128x128_c1x1_ovl_sk", "sm90_coop_128x128x128_c2x1_ovl_sk",
                     "sm90_coop_128x128x128_c2x1_ovl_epi64x3",
                     "sm90_coop_128x128x128_c2x1_ovl"]
    assert ops.gemm_k_plan(1, 32, 4096, 7168, 66)["plan"] == "K slices x2", "two slices of 32 tiles fill 66 SMs"
    assert ops.gemm_k_plan(1, 32, 4096, 7168, 16)["plan"] == "data-parallel", "more tiles than SMs"
    assert ops.gemm_k_plan(0, 32, 4096, 7168, 132)["plan"] == "data-parallel", "the ping-pong row never splits K"
    # The launch's workspace: none for a data-parallel plan (no memset node before the GEMM), split-K /
    # stream-K state or the K slices' fp32 partials (at least slices x M x N x 4 bytes) otherwise.
    assert ops.gemm_k_plan(5, 128, 6144, 4096, 132)["workspace_bytes"] == 0
    assert ops.gemm_k_plan(1, 32, 4096, 7168, 132)["workspace_bytes"] >= 4 * 32 * 4096 * 4
    assert ops.gemm_k_plan(6, 96, 4096, 7168, 132)["workspace_bytes"] > 0, "split-K x2"
    assert ops.gemm_k_plan(5, 128, 6144, 4096, 132)["tile_n"] == 0, "CUTLASS rows have a fixed tile"
    assert ops.gemm_k_plan(7, 384, 2112, 7168, 132)["tile_n"] == 96, "the tok64 width rule above M = 256 too"
    with pytest.raises(ValueError, match="row index out of range"):
        ops.gemm_k_plan(99, 32, 4096, 4096, 132)
    with pytest.raises(ValueError, match="multiple of 128"):
        ops.gemm_k_plan(0, 32, 4096, 4000, 132)


GEMM_SELECTION_AT_132_SMS = [  # (m, n, k, row): gemm/sm90/plan.cpp's rules
    (32, 4096, 4096, "sm90_swapab_64x32x128_pp_ovl"),  # 64 tiles of 64 rows: one wave from 64 up
    (20, 8192, 2048, "sm90_swapab_64x32x128_pp_ovl"),  # 128 tiles
    (64, 4096, 7168, "sm90_swapab_64x32x128_pp_ovl"),  # 2 x 64 tiles
    (32, 2112, 7168, "sm90_swapab_128x32x128"),  # 33 tiles: the 128-row row's 4 K slices
    (32, 11008, 4096, "sm90_swapab_128x32x128"),  # 172 tiles: more than one wave
    (32, 24576, 1536, "sm90_swapab_64x32x128_pp_ovl"),  # 384 tiles: 3 waves, the 128-row row's 192: 2
    (24, 17920, 1536, "sm90_swapab_64x32x128_pp_ovl"),  # 280 tiles: 3 waves against 2
    (56, 10944, 2048, "sm90_swapab_64x32x128_pp_ovl"),  # 342: 3 against 2, ahead of the 64x64 row
    (40, 17920, 1536, "sm90_swapab_128x32x128"),  # 560 tiles: 5 waves against 3
    (32, 27648, 5120, "sm90_swapab_128x32x128"),  # 432 tiles: 4 waves (three plus 36 tiles) against 2
    (48, 24576, 1536, "sm90_swapab_128x32x128"),  # 768 tiles, but two token tiles
    (48, 6144, 4096, "sm90_swapab_128x32x128"),  # 192 tiles, M <= 48
    (49, 6144, 4096, "sm90_swapab_64x64x128_pp_ovl"),  # 192 tiles: one 64-token tile per weight tile
    (64, 6144, 4096, "sm90_swapab_64x64x128_pp_ovl"),
    (64, 1536, 7168, "sm90_swapab_128x32x128"),  # 48 tiles of 64 rows: the 128-row row's K slices
    (96, 4096, 4096, "sm90_tok64_fitn"),  # 2 x 64 tiles of 64x64: one wave
    (128, 2048, 2048, "sm90_tok64_fitn"),  # 2 x 64 tiles of 64x32
    (128, 6144, 4096, "sm90_tok64_fitn"),  # 2 x 64 tiles of 64x96
    (96, 1984, 2048, "sm90_tok64_fitn"),  # 2 x 62 tiles of 64x32
    (128, 8192, 2048, "sm90_swapab_128x64x128_ovl_persistent"),  # 128 tiles, but 128 wide; 256 64-row tiles
    (128, 9216, 3072, "sm90_tok64_fitn"),  # 2 x 64 tiles of 64x144: one wave (144 128x64 tiles: two)
    (100, 9216, 3072, "sm90_tok64_fitn"),  # the same at M = 100
    (96, 11008, 4096, "sm90_tok64_fitn"),  # 2 x 58 tiles of 64x192
    (112, 12288, 4096, "sm90_tok64_fitn"),  # 2 x 64 tiles of 64x192 at M = 112..128 too (E22c)
    (112, 11008, 4096, "sm90_tok64_fitn"),  # ahead of E20b's thin second wave (172 128x64 tiles)
    (128, 12672, 4096, "sm90_tok64_fitn"),  # 2 x 66 tiles of 64x192: the widest one wave
    (128, 12680, 4096, "sm90_swapab_128x64x128_ovl_persistent"),  # 2 x 67 tiles: no tok64 width fits one wave
    (128, 17920, 1536, "sm90_swapab_128x64x128_ovl_persistent"),  # 280 tiles: three waves (~0.99, not taken)
    (128, 1536, 7168, "sm90_tok64_fitn"),  # 2 x 48 tiles of 64x32: 96, the fewest measured
    (64, 4096, 4096, "sm90_swapab_64x32x128_pp_ovl"),  # M <= 64: the swap rows
    (96, 10240, 7168, "sm90_tok64_fitn"),  # 2 x 64 tiles of 64x160: one wave
    (96, 18688, 7168, "sm90_swapab_128x64x128_ovl_persistent"),  # no tok64 width fits one wave (260 tiles of 64x144)
    (128, 576, 7168, "sm90_swapab_128x64x128_ovl_slicek"),  # 72 tiles of 64x16 (< 96): 4 slices
    (96, 2048, 4096, "sm90_tok64_fitn"),  # 64x32 tiles ahead of the 64-row swap tiles and the slices
    (128, 7168, 12288, "sm90_swapab_128x64x128_ovl_persistent"),  # 128 tiles of 64x112 (> 96)
    (128, 11008, 4096, "sm90_tok64_fitn"),  # 2 x 58 tiles of 64x192 (E22c; E20b's 64x64 row before)
    (124, 8832, 2048, "sm90_tok64_fitn"),  # 2 x 62 tiles of 64x144, ahead of E20b's 64x64 row
    (128, 2048, 12288, "sm90_tok64_fitn"),  # 128 tiles of 64x32 (the 128x64 row would stream-K)
    (128, 1024, 24576, "sm90_swapab_128x64x128_ovl"),  # 128 tiles, but 16 wide (unmeasured): stream-K
    (128, 576, 24576, "sm90_swapab_128x64x128_ovl"),  # 72 tiles of 64x16; the 128x64 row's stream-K
    (160, 4096, 4096, "sm90_swapab_128x64x128_ovl_persistent"),  # 96 tiles: one wave above M = 128
    (256, 4096, 4096, "sm90_swapab_128x64x128_ovl_persistent"),  # 128 tiles
    (160, 2112, 7168, "sm90_swapab_128x64x128_ovl_slicek"),  # 51 tiles: 2 slices
    (256, 2112, 7168, "sm90_swapab_64x64x128_pp_ovl"),  # 132 64-row tiles, the 128x64 row unsplit
    (256, 6144, 4096, "sm90_coop_128x128x128_c2x1_ovl"),  # 192 swap tiles: two waves against one
    (192, 9216, 3072, "sm90_swapab_128x64x128_ovl_persistent"),  # 216 swap tiles, 144 of 128x128: two waves each
    (192, 12288, 3072, "sm90_coop_128x128x128_c2x1_ovl"),  # 288 swap tiles: three waves against two
    (144, 9216, 7168, "sm90_swapab_128x64x128_ovl_persistent"),  # ahead of the stream-K row (last wave 12 / 132)
    (257, 4096, 4096, "sm90_coop_128x128x128_c2x1_ovl"),  # above the swap rows' bound
    (200, 11008, 4096, "sm90_coop_128x128x128_c2x1_ovl"),  # last wave 40 / 132 full, but 32 K blocks
    (1024, 2112, 7168, "sm90_coop_128x128x128_c2x1_ovl_sk"),  # last wave 4 / 132 full, 56 K blocks
    (3000, 2112, 7168, "sm90_coop_128x128x128_c2x1_ovl_sk"),  # 408 tiles: 12 / 132
    (1024, 4096, 4096, "sm90_coop_128x128x128_c2x1_ovl_epi64x3"),  # 32 K blocks: the row's bound (E18b)
    (1024, 32768, 512, "sm90_coop_128x128x128_c2x1_ovl_epi64x3"),  # 4 K blocks: the epilogue's waits matter
    (2048, 9728, 896, "sm90_coop_128x128x128_c2x1_ovl_epi64x3"),  # 7 K blocks
    (8192, 4096, 1024, "sm90_coop_128x128x128_c2x1_ovl_epi64x3"),  # 8 K blocks
    (8192, 24576, 1536, "sm90_coop_128x128x128_c2x1_ovl_epi64x3"),  # 12 K blocks (E17)
    (4096, 7168, 2048, "sm90_coop_128x128x128_c2x1_ovl_epi64x3"),  # 16 K blocks
    (2048, 9216, 3072, "sm90_coop_128x128x128_c2x1_ovl_epi64x3"),  # 24 K blocks (E18)
    (1024, 8192, 3840, "sm90_coop_128x128x128_c2x1_ovl_epi64x3"),  # 30 K blocks
    (1024, 8192, 3968, "sm90_coop_128x128x128_c2x1_ovl_epi64x3"),  # 31 K blocks (between measured K)
    (1024, 12288, 4096, "sm90_coop_128x128x128_c2x1_ovl_epi64x3"),  # 32 K blocks, the most it takes (E18b)
    (1024, 12288, 4224, "sm90_coop_128x128x128_c2x1_ovl"),  # 33 K blocks: the plain row
    (1023, 16384, 512, "sm90_coop_128x128x128_c2x1_ovl_epi64x3"),  # 1024 tiles: changes of tile from M = 384 (E28b/c)
    (384, 6144, 2048, "sm90_coop_128x128x128_c2x1_ovl_epi64x3"),  # 3 token tiles, 4 in clusters: 192; the least M
    (383, 6144, 2048, "sm90_coop_128x128x128_c2x1_ovl"),  # below M = 384 (M = 256 lost up to 1.03x, E28)
    (384, 16384, 2048, "sm90_coop_128x128x128_c1x1_ovl_epi64x3"),  # 384 tiles: 3 rounds; 512 in 2x1 clusters: 4 (E30)
    (384, 5120, 6144, "sm90_coop_128x128x128_c1x1_ovl_epi64x3"),  # 120 tiles: one round; 160: two (stream-K before E30)
    (384, 4096, 4096, "sm90_coop_128x128x128_c2x1_ovl"),  # 96 tiles against 128: one round each
    (640, 6144, 4096, "sm90_coop_128x128x128_c1x1_ovl_epi64x3"),  # 240 tiles against 288: 2 rounds against 3
    (896, 2112, 7168, "sm90_coop_128x128x128_c1x1_ovl_epi64x3"),  # 7 x 17 = 119 against 136: ahead of the stream-K row
    (1152, 7168, 2048, "sm90_coop_128x128x128_c1x1_ovl_epi64x3"),  # 504 tiles (4 rounds) against 560 (5)
    (1280, 7168, 2048, "sm90_coop_128x128x128_c2x1_ovl_epi64x3"),  # 10 token tiles: no padding tile
    (640, 4096, 7168, "sm90_coop_128x128x128_c1x1_ovl_sk"),  # 160 tiles: last round 28 / 132; 192 in clusters: 60
    (300, 6144, 6144, "sm90_coop_128x128x128_c1x1_ovl_sk"),  # 144 tiles: 12 / 132; 192 in clusters: 60; tok64: 2 waves
    (384, 2112, 7168, "sm90_tok64_fitn_narrow"),  # 51 128x128 tiles; 132 of 64x96: 160 / 256 bytes a block (E33)
    (257, 2112, 7168, "sm90_tok64_fitn_narrow"),  # 5 x 22 = 110 tiles of 64x96, the least M it takes
    (512, 2112, 7168, "sm90_coop_128x128x128_c2x1_ovl"),  # 120 tiles of 64x144: 208 / 256 (> 3/4; 0.96x measured)
    (384, 288, 2560, "sm90_tok64_fitn_narrow"),  # 108 tiles of 64x16
    (1664, 576, 7168, "sm90_tok64_fitn_narrow"),  # 130 tiles of 64x128: 192 / 256, the bar itself
    (2048, 576, 7168, "sm90_coop_128x128x128_c2x1_ovl"),  # 160 tiles of 64x128: two waves
    (2176, 2112, 7168, "sm90_coop_128x128x128_c2x1_ovl_sk"),  # 289 tiles (25 / 132), 306 in clusters (42): both stream
    (2176, 7168, 16384, "sm90_coop_128x128x128_c1x1_ovl_sk"),  # 952 tiles (28 / 132) against 1008 (84): 8 rounds each
    (576, 3584, 4096, "sm90_coop_128x128x128_c2x1_ovl_epi64x3"),  # 5 token tiles, 6 in 2x1 clusters: 168 > 132
    (640, 2560, 4096, "sm90_coop_128x128x128_c2x1_ovl"),  # 6 x 20 = 120 tiles: one wave, no tile change
    (768, 12288, 4224, "sm90_coop_128x128x128_c2x1_ovl"),  # 33 K blocks: the plain row at any M
    (256, 32768, 512, "sm90_coop_128x128x128_c2x1_ovl"),  # the swap rows' M, where they lose: the plain row
]


@pytest.mark.skipif("9.0a" not in ops.build_info().get("archs", []) if ops.HAS_CUDA_KERNELS else True,
                    reason="the SM90 GEMM is not in this build (TORCH_CUDA_ARCH_LIST without 9.0a)")
def test_sm90_gemm_selection_at_132_sms():
    """Row selection by M and by the rows' selection preconditions, host logic only."""
    got = [(m, n, k, ops.gemm_k_plan(-1, m, n, k, 132)["row"]) for m, n, k, _ in GEMM_SELECTION_AT_132_SMS]
    assert got == GEMM_SELECTION_AT_132_SMS
    assert ops.gemm_k_plan(-1, 32, 4096, 4096, 63)["row"] == "sm90_swapab_128x32x128", "64 tiles > 63 SMs"
    assert ops.gemm_k_plan(-1, 96, 2048, 2048, 132)["row"] == "sm90_tok64_fitn"
    assert ops.gemm_k_plan(-1, 96, 2048, 2048, 127)["row"] == "sm90_swapab_64x64x128_pp_ovl", "128 tiles > 127 SMs"
    assert ops.gemm_k_plan(-1, 96, 1984, 2048, 132)["row"] == "sm90_tok64_fitn", "124 tiles of 64x32"
    # E20b's thin second wave (M = 112..128, the 128x64 row's second wave at most 40% full) decides only where the
    # tok64 row's 96-tile minimum cannot be met: 78 SMs (H20). 6144 wide: 96 128x64 tiles, 18 in the second wave.
    assert ops.gemm_k_plan(-1, 112, 6144, 4096, 78)["row"] == "sm90_swapab_64x64x128_pp_ovl"
    assert ops.gemm_k_plan(-1, 112, 7168, 4096, 78)["row"] == "sm90_swapab_128x64x128_ovl_persistent", "34 > 31"
    assert ops.gemm_k_plan(-1, 112, 11008, 4096, 132)["row"] == "sm90_tok64_fitn"


GEMM_ORDERS_AT_132_SMS = [  # (m, n, k, order): plan.cpp's default order and swizzle fit
    (1024, 4096, 4096, "heuristic:1"),  # below M = 2048: CUTLASS's defaults
    (8192, 7168, 16384, "along_m:8"),  # 64 x 56 tiles: no padding at 8
    (6000, 6144, 4096, "along_m:8"),  # 47 token tiles, 48 in 2x1 clusters: a multiple of 16
    (2048, 2112, 7168, "along_m:1"),  # 17 weight tiles: any swizzle pads them
    (8192, 2112, 7168, "along_m:1"),
    (2176, 7168, 16384, "along_m:1"),  # 17 token tiles (18 in clusters) would pad to 32, 24 or 20
    (2560, 4096, 4096, "along_m:2"),  # 20 token tiles: whole groups of 2 clusters of 2, not of 4 or 8
    (4096, 576, 7168, "along_m:1"),  # 5 weight tiles
]


@pytest.mark.skipif("9.0a" not in ops.build_info().get("archs", []) if ops.HAS_CUDA_KERNELS else True,
                    reason="the SM90 GEMM is not in this build (TORCH_CUDA_ARCH_LIST without 9.0a)")
def test_sm90_gemm_tile_order_at_132_sms():
    """The persistent tile order the selected row launches with: along M from M = 2048, the swizzle
    lowered until CUTLASS pads the tile grid no further than whole clusters (host logic only)."""
    got = [(m, n, k, ops.gemm_k_plan(-1, m, n, k, 132)["order"]) for m, n, k, _ in GEMM_ORDERS_AT_132_SMS]
    assert got == GEMM_ORDERS_AT_132_SMS
    assert ops.gemm_k_plan(1, 32, 4096, 4096, 132)["order"] == "heuristic:1", "swap rows keep CUTLASS's order"
