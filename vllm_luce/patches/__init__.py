"""The patch ledger: every place vllm-luce changes vLLM code it does not own.

Registries come first (models: ModelRegistry; later KV specs, attention backends). A patch is
used only where vLLM has no hook. Each patch lives in its own module named after its target,
checks the target's signature before touching it (a mismatch stops startup), is idempotent,
and has an entry below saying why it exists, how it works and when it can be removed.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable


class PatchTargetChanged(RuntimeError):
    pass


@dataclass(frozen=True)
class LedgerEntry:
    target: str
    module: str
    why: str
    how: str
    remove_when: str


LEDGER: tuple[LedgerEntry, ...] = (
    LedgerEntry(
        target="vllm.config.vllm:VllmConfig.__post_init__",
        module="vllm_luce.patches.vllm_config",
        why="vLLM has no hook that validates `--additional-config` for a general plugin. Without one, "
            "a typo in the `luce` settings would be ignored, or fail late inside a worker.",
        how="Wraps __post_init__: parses and validates LuceConfig before vLLM's own checks, so a bad key "
            "stops `vllm serve` / `LLM(...)` in the API-server process, then logs the active features.",
        remove_when="vLLM offers a config-validation hook for plugins (e.g. a `vllm.config_validators` "
                    "entry point) or an additional_config schema registry.",
    ),
)


def wrap_method(owner: type, name: str, expected_signature: str,
                make_wrapper: Callable[[Callable], Callable]) -> bool:
    """Replace `owner.name` by `make_wrapper(original)`; False if already done. Checks the signature."""
    original = owner.__dict__.get(name)
    if original is None:
        raise PatchTargetChanged(f"{owner.__module__}.{owner.__qualname__}.{name} no longer exists; "
                                 "this vLLM is not supported by vllm-luce")
    if getattr(original, "__luce_patched__", False):
        return False
    actual = str(inspect.signature(original))
    if actual != expected_signature:
        raise PatchTargetChanged(
            f"{owner.__module__}.{owner.__qualname__}.{name} has signature {actual}; vllm-luce expects "
            f"{expected_signature}. This vLLM is not supported by vllm-luce.")
    wrapper = make_wrapper(original)
    wrapper.__luce_patched__ = True
    wrapper.__wrapped__ = original
    setattr(owner, name, wrapper)
    return True


def apply_patches() -> None:
    from vllm_luce.patches import vllm_config

    vllm_config.apply()
