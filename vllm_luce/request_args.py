"""Per-request switches a client sends in ``vllm_xargs`` (vLLM's ``SamplingParams.extra_args``):

    client.completions.create(..., extra_body={"vllm_xargs": {"luce_dflash": "off", "luce_pflash": "off"}})

``luce_dflash: off``: the request uses no drafts (the DFlash gate drops them before verification) while other
requests keep speculating; its output is what it would be without speculation. ``luce_pflash: off``: its prompt
is never compressed. Each takes ``on``/``off`` (also true/false, yes/no, 1/0, as JSON booleans or numbers). The
engine clients check the values (``check``) before a request is added, so a typo is an HTTP 400 naming the key,
never a silent default; the engine core reads them leniently (``declined``): a request that reaches it was checked.
"""

from __future__ import annotations

import functools
from typing import Any

DFLASH = "luce_dflash"
PFLASH = "luce_pflash"
SWITCHES = (DFLASH, PFLASH)
_OFF = {"off", "false", "no", "0"}
_ON = {"on", "true", "yes", "1"}


def _normalized(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value).strip().lower()


def declined(params: Any, key: str) -> bool:
    """Whether the request asks for ``key`` off (absent or any other value: not declined)."""
    extra = getattr(params, "extra_args", None)
    return bool(extra) and key in extra and _normalized(extra[key]) in _OFF


def check(params: Any) -> None:
    """A ValueError naming the key for a switch whose value is neither on nor off; where vLLM is installed, also
    vLLM's ``VLLMValidationError``, which its servers answer with HTTP 400 (vLLM 0.32 answers a plain ValueError
    raised there with a 500)."""
    extra = getattr(params, "extra_args", None)
    if not extra:
        return
    for key in SWITCHES:
        if key in extra and _normalized(extra[key]) not in _OFF | _ON:
            raise bad_request(f"vllm_xargs.{key}: got {extra[key]!r}; expected \"on\" or \"off\"")


def bad_request(message: str) -> ValueError:
    """A ValueError that vLLM's servers answer with HTTP 400: in a stream, an error event with code 400."""
    return _error_class()(message)


@functools.cache
def _error_class() -> type[ValueError]:
    try:
        from vllm.exceptions import VLLMValidationError
    except ImportError:
        return ValueError
    return type("RequestArgError", (VLLMValidationError, ValueError), {})
