"""The ``vllm.general_plugins`` entry point: found by metadata, loaded by vLLM's own loader in a
fresh process (so nothing else registered it first), idempotent, and free of CUDA initialisation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

# Runs in a fresh interpreter: the state before vLLM's loader is observed, not assumed.
_PROBE = r"""
import json, torch
facts = {"cuda_before": torch.cuda.is_initialized()}
from vllm.model_executor.layers import quantization as q
facts["listed_before"] = "blockfp8" in q.QUANTIZATION_METHODS
from vllm.plugins import load_general_plugins
load_general_plugins()
facts["listed_after"] = "blockfp8" in q.QUANTIZATION_METHODS
import vllm_blockfp8
from vllm_blockfp8.config import BlockFp8Config
facts["config_class"] = q.get_quantization_config("blockfp8") is BlockFp8Config
vllm_blockfp8.register()
vllm_blockfp8.register()
vllm_blockfp8._registered = False  # also past the module's guard: vLLM's registry must not duplicate
vllm_blockfp8.register()
facts["count"] = q.QUANTIZATION_METHODS.count("blockfp8")
facts["config_class_again"] = q.get_quantization_config("blockfp8") is BlockFp8Config
facts["cuda_after"] = torch.cuda.is_initialized()
print("FACTS" + json.dumps(facts))
"""


@pytest.fixture(scope="module")
def probe():
    env = {k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS"}
    proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("FACTS")]
    assert line, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(line[-1][len("FACTS"):])


def test_entry_point_is_declared():
    eps = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "blockfp8"]
    assert len(eps) == 1, eps
    assert eps[0].value == "vllm_blockfp8:register"
    import vllm_blockfp8

    assert eps[0].load() is vllm_blockfp8.register


def test_vllm_loader_registers(probe):
    assert not probe["listed_before"], "blockfp8 was registered before vLLM's plugin loader ran"
    assert probe["listed_after"], "load_general_plugins() did not register blockfp8"
    assert probe["config_class"]


def test_register_twice_is_harmless(probe):
    assert probe["count"] == 1
    assert probe["config_class_again"]


def test_register_does_not_initialise_cuda(probe):
    assert not probe["cuda_before"]
    assert not probe["cuda_after"], "importing or registering the plugin initialised CUDA"
