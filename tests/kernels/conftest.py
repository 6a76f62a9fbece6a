"""Kernel tests run on a CUDA device, or on CPU under Triton's interpreter (TRITON_INTERPRET=1).

TRITON_INTERPRET must be in the environment before triton is imported, so it cannot be set here:
    TRITON_INTERPRET=1 python -m pytest tests/kernels -q
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vllm_luce.kernels._triton import is_interpreter

_KERNEL_TESTS_DIR = Path(__file__).parent
_SKIP_REASON = ("Triton kernel tests need a CUDA device or the CPU interpreter: "
                "run with TRITON_INTERPRET=1 in the environment")


def pytest_collection_modifyitems(config, items):
    # This hook sees every collected item of the session, so only this folder's items are marked.
    if is_interpreter() or torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=_SKIP_REASON)
    for item in items:
        if _KERNEL_TESTS_DIR in Path(item.fspath).parents:
            item.add_marker(skip)


@pytest.fixture
def device() -> torch.device:
    """CPU under the interpreter (it copies CUDA tensors to the host anyway), CUDA otherwise."""
    return torch.device("cpu" if is_interpreter() else "cuda")


@pytest.fixture
def poisoned(device):
    """poisoned(shape, dtype) -> a NaN-filled tensor: any element a kernel fails to write stays NaN."""

    def make(shape, dtype=torch.float32) -> torch.Tensor:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    return make
