"""Host-only logic of the compiled extension: runs wherever the extension was built (CI builds it
without a GPU), so these checks do not wait for a GPU machine."""

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
    assert set(info["families"]) == {"quant", "gemv", "gemm"}
    assert (info["families"]["gemm"] == "9.0a") == ("9.0a" in info["archs"]), info


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
    ops.check_sm90_env({})
    ops.check_sm90_env({"BLOCKFP8_SM90_RASTER": "along_n", "BLOCKFP8_SM90_SWIZZLE": "8"})
    ops.check_sm90_env({"BLOCKFP8_SM90_RASTER": ""})
    with pytest.raises(ValueError, match="BLOCKFP8_SM90_RASTER='alongn'"):
        ops.check_sm90_env({"BLOCKFP8_SM90_RASTER": "alongn"})
    with pytest.raises(ValueError, match="BLOCKFP8_SM90_SWIZZLE='3'"):
        ops.check_sm90_env({"BLOCKFP8_SM90_SWIZZLE": "3"})
    ops.check_sm90_env({"BLOCKFP8_SM90_SPLITS": "3", "BLOCKFP8_SM90_REDUCTION": "nondeterministic"})
    with pytest.raises(ValueError, match="BLOCKFP8_SM90_SPLITS='5'"):
        ops.check_sm90_env({"BLOCKFP8_SM90_SPLITS": "5"})
    with pytest.raises(ValueError, match="BLOCKFP8_SM90_REDUCTION='fast'"):
        ops.check_sm90_env({"BLOCKFP8_SM90_REDUCTION": "fast"})
