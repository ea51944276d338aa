"""Host-only logic of the compiled extension: runs wherever the extension was built (CI builds it
without a GPU), so these checks do not wait for a GPU machine."""

import pytest

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
