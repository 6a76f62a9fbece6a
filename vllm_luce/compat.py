"""Which vLLM versions vllm-luce supports, and the check that enforces it.

vllm-luce binds to vLLM internals (model classes, config hooks, spec-decode runners), so an
unsupported vLLM must stop the server with a clear message rather than fail somewhere deep
inside a worker. `VLLM_LUCE_SKIP_VERSION_CHECK=1` turns the error into a warning, for people
trying a newer vLLM on purpose.
"""

from __future__ import annotations

import os
import re

# Half-open range [MIN, MAX): 0.32.x and 0.33.x. Keep in sync with pyproject's `vllm` extra
# and the README's compatibility table (tests/test_compat.py checks all three agree).
MIN_VLLM = (0, 32)
MAX_VLLM = (0, 34)
SKIP_ENV = "VLLM_LUCE_SKIP_VERSION_CHECK"


class UnsupportedVllmVersion(RuntimeError):
    pass


def parse_version(version: str) -> tuple[int, int, int]:
    """'0.32.0+cpu' -> (0, 32, 0); '0.33.1rc2.dev5' -> (0, 33, 1)."""
    match = re.match(r"^(\d+)\.(\d+)(?:\.(\d+))?", version)
    if match is None:
        raise UnsupportedVllmVersion(f"cannot read the vLLM version {version!r}")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def is_supported(version: str) -> bool:
    return MIN_VLLM <= parse_version(version)[:2] < MAX_VLLM


def supported_range() -> str:
    return f">={MIN_VLLM[0]}.{MIN_VLLM[1]},<{MAX_VLLM[0]}.{MAX_VLLM[1]}"


def check_vllm_version(version: str, environ: os._Environ | dict | None = None) -> str | None:
    """Raise for an unsupported vLLM; return a warning text instead when the override is set."""
    environ = os.environ if environ is None else environ
    if is_supported(version):
        return None
    message = (
        f"vllm-luce supports vLLM {supported_range()}, but vLLM {version} is installed. "
        f"Install a supported vLLM (pip install 'vllm-luce[vllm]') or set {SKIP_ENV}=1 "
        "to run anyway at your own risk."
    )
    if environ.get(SKIP_ENV, "") in ("1", "true", "yes"):
        return message
    raise UnsupportedVllmVersion(message)
