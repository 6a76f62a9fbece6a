"""Patches: every place vllm-luce changes vLLM code it does not own, and the tools that apply them.

Registries come first (models: ModelRegistry, KV specs); every hook, patch or not, is a row of
``vllm_luce/hooks.py``, whose patch rows ``apply_patches`` iterates. A patch is used only where vLLM
has no hook. Each patch lives in its own module named after its target (here; a patch that serves vLLM 0.26
alone, in vllm_luce/vllm026/), ends in _v1 or _v2 where it patches one model runner, checks the target's
signature before touching it (a mismatch stops startup), is idempotent, and has an entry in the
ledger (``vllm_luce/hook_ledger.py``) saying why it exists, how it works and when it can be removed.
"""

from __future__ import annotations

import sys
from typing import Callable

from vllm_luce.compat import installed_series
from vllm_luce.hook_ledger import PatchTargetChanged, check_signature


def wrap_method(owner: type, name: str, expected_signature: str,
                make_wrapper: Callable[[Callable], Callable], inherited: bool = False) -> bool:
    """Replace `owner.name` by `make_wrapper(original)`; False if already done. Checks the signature.
    ``inherited``: the method may come from a base class; the wrapper is set on ``owner`` only. A static or class
    method's wrapper is made one too (a class method's takes ``cls`` first, as its function does)."""
    original = getattr(owner, name, None) if inherited else owner.__dict__.get(name)
    kind = type(original) if isinstance(original, (staticmethod, classmethod)) else None
    if kind is not None:
        original = original.__func__
    if original is None:
        raise PatchTargetChanged(f"{owner.__module__}.{owner.__qualname__}.{name} no longer exists; "
                                 "this vLLM is not supported by vllm-luce")
    if getattr(original, "__luce_patched__", False) and (not inherited or name in owner.__dict__):
        return False
    check_signature(f"{owner.__module__}.{owner.__qualname__}.{name}", original, expected_signature)
    wrapper = make_wrapper(original)
    wrapper.__luce_patched__ = True
    wrapper.__wrapped__ = original
    setattr(owner, name, kind(wrapper) if kind is not None else wrapper)
    return True


def wrap_function(module, name: str, expected_signature: str,
                  make_wrapper: Callable[[Callable], Callable]) -> bool:
    """``wrap_method`` for a module-level function (callers inside the module see the wrapper)."""
    holder = type("ModuleFunctions", (), {name: getattr(module, name, None)}) if hasattr(module, name) else None
    if holder is None:
        raise PatchTargetChanged(f"{module.__name__}.{name} no longer exists; this vLLM is not supported "
                                 "by vllm-luce")
    done = wrap_method(holder, name, expected_signature, make_wrapper)
    if done:
        setattr(module, name, holder.__dict__[name])
    return done


class _AfterImport:
    """A meta-path finder that runs callbacks right after a module's own code has executed."""

    def __init__(self):
        self.pending: dict[str, list[Callable[[], object]]] = {}

    def find_spec(self, name, path=None, target=None):
        if name not in self.pending:
            return None
        import importlib.util

        sys.meta_path.remove(self)  # find the real spec without recursing into this finder
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        callbacks, exec_module = self.pending.pop(name), spec.loader.exec_module

        def exec_then_patch(module):
            exec_module(module)
            for callback in callbacks:
                callback()

        spec.loader.exec_module = exec_then_patch
        return spec


_after_import = _AfterImport()


def when_imported(module_name: str, callback: Callable[[], object]) -> None:
    """Run ``callback`` now if ``module_name`` is loaded, else right after it is first imported.
    Worker-side patches use it, so processes that never load the model runner (the API server)
    never import it."""
    if module_name in sys.modules:
        callback()
        return
    _after_import.pending.setdefault(module_name, []).append(callback)
    if _after_import not in sys.meta_path:
        sys.meta_path.insert(0, _after_import)


def apply_engine_client_patches(pflash: bool) -> None:
    """The engine-client patch rows of vllm_luce/hooks.py, applied by the VllmConfig patch when the DFlash gate,
    PFlash or paged KVFlash is on: the per-request switches' check, PFlash's prompt compression, KVFlash's refusal of
    a prompt beyond its host share and (PFlash only) the chat request's skip reason."""
    from vllm_luce import hooks

    stages = (hooks.ENGINE_CLIENT, hooks.ENGINE_CLIENT_PFLASH) if pflash else (hooks.ENGINE_CLIENT,)
    _apply_when_imported(hooks.rows(hooks.PATCH, *stages))


def _apply_when_imported(rows) -> None:
    """Apply each row's patch module once its target's module is imported, unless the ledger says vllm-luce leaves
    that target alone in the installed vLLM series (a module with several rows is applied once)."""
    import importlib

    series, seen = installed_series(), set()
    for row in rows:
        if row.ledger.signature_in(series) is None or row.owners in seen:
            continue
        seen.add(row.owners)
        when_imported(row.target.split(":")[0], importlib.import_module(row.owners[0]).apply)


def apply_patches() -> None:
    """The patch rows of vllm_luce/hooks.py: the startup ones now, in every process; the worker-side ones right
    after their module is first imported. (Engine-client rows: apply_engine_client_patches; the scheduler's
    override: vllm-luce's scheduler classes.)"""
    import importlib

    from vllm_luce import hooks

    for module in dict.fromkeys(row.owners[0] for row in hooks.rows(hooks.PATCH, hooks.STARTUP)):
        importlib.import_module(module).apply()
    _apply_when_imported(hooks.rows(hooks.PATCH, hooks.ON_IMPORT))
