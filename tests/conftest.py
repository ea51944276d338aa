"""Shared fixtures: one single-process vLLM distributed environment, CPU layer construction, and
simulated tensor-parallel ranks (vLLM reads the rank and size through two module globals)."""

from __future__ import annotations

import contextlib
import socket

import pytest
import torch


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def vllm_dist():
    """Register the plugin and start a world of one rank (gloo); layers are built on CPU."""
    import vllm_blockfp8
    from vllm.distributed import (destroy_distributed_environment, destroy_model_parallel,
                                  init_distributed_environment, initialize_model_parallel)

    vllm_blockfp8.register()
    with cpu_layers():  # initialize_model_parallel reads the current vLLM config
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{_free_port()}")
        initialize_model_parallel(1, 1)
    yield
    destroy_model_parallel()
    destroy_distributed_environment()


@contextlib.contextmanager
def simulate_tp(rank: int, size: int):
    """Build layers as rank ``rank`` of ``size``: vLLM's linear layers and parameters both import
    the two getters by name (grep get_tensor_model_parallel in linear.py / parameter.py), so both
    modules are patched; the layer then stamps its rank on every parameter."""
    import vllm.model_executor.layers.linear as vllm_linear
    import vllm.model_executor.parameter as vllm_parameter

    with pytest.MonkeyPatch.context() as mp:
        for mod in (vllm_linear, vllm_parameter):
            mp.setattr(mod, "get_tensor_model_parallel_rank", lambda: rank)
            mp.setattr(mod, "get_tensor_model_parallel_world_size", lambda: size)
        yield


@contextlib.contextmanager
def cpu_layers():
    """The vLLM config context that layer constructors read (device CPU)."""
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
        yield


def needs_kernels(capability=None, extension=True):
    """Skip mark for GPU tests, whose reason names exactly what is missing: no GPU, the wrong GPU
    (``capability`` (major, minor)), and/or the compiled extension (``extension``)."""
    from vllm_blockfp8 import ops

    reason = ops.kernels_unavailable_reason(capability, extension)
    return pytest.mark.skipif(reason is not None, reason=f"needs a GPU run: {reason}")


@pytest.fixture
def seeded():
    torch.manual_seed(0)
    return torch.Generator().manual_seed(0)


def poison_cuda_cache(*nbytes: int) -> None:
    """Fill freed blocks of the CUDA caching allocator with 0xFF bytes (NaN as fp8 e4m3fn, bf16,
    fp16 and fp32), so an op output carved from them fails any check on an element the kernel left
    unwritten: one block of each size given (the sizes the op is about to allocate), a large block,
    and 16 blocks of the small-allocation pool (requests up to 1 MiB are served from it)."""
    blocks = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in nbytes if n > 0]
    blocks.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
    blocks += [torch.empty(1 << 20, dtype=torch.uint8, device="cuda") for _ in range(16)]
    for block in blocks:
        block.fill_(0xFF)
    del blocks
