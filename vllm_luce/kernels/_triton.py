"""Helpers shared by the Triton kernels of vllm_luce.kernels."""

from __future__ import annotations

import os

import triton

# The values Triton itself accepts as "on" for TRITON_INTERPRET (its knobs parse it case-insensitively).
_TRUE_VALUES = frozenset({"1", "true", "on", "yes", "y"})


def is_interpreter() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET is set to a true value).

    Triton reads the variable when it is imported, so it must be set before `import triton`.
    """
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in _TRUE_VALUES


def autotune(configs: list[triton.Config], key: list[str], **kwargs):
    """`triton.autotune` that keeps only the first config under the interpreter.

    Benchmarking several configs needs a GPU driver and fails under the CPU interpreter; with a
    single config the autotuner launches it directly. So the first config of every kernel should be
    a sound default.
    """
    if is_interpreter():
        configs = configs[:1]
    return triton.autotune(configs=configs, key=key, **kwargs)
