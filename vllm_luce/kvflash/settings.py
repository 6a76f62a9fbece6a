"""KVFlash settings derived from the resolved LuceConfig and what a process knows of the host and model (pure); the
plan every process shares is ``plan.py``'s."""

from __future__ import annotations

import os
import tempfile


def longest_page_out(max_model_len: int, pool_tokens: int, chunk_tokens: int, chunk_bytes: int) -> int:
    """Bytes one request of ``max_model_len`` tokens pages out (its chunks beyond the pool, of ``chunk_bytes``)."""
    return -(-max(0, max_model_len - pool_tokens) // chunk_tokens) * chunk_bytes


def resolve_pinned_bytes(pinned_bytes, host_budget: int | None, chunk_bytes: int, max_model_len: int,
                         pool_tokens: int, chunk_tokens: int) -> int:
    """Host memory this worker pins at startup for page-outs, at most ``host_budget``. 'auto': what one request
    of the longest context pages out (its tokens beyond the pool, in chunks of ``chunk_bytes`` on this worker):
    a prompt of any length pages out without pinning while it is served (host_pool.py), and more concurrent long
    requests than one page their excess to pageable memory."""
    if pinned_bytes == "auto":
        pinned_bytes = longest_page_out(max_model_len, pool_tokens, chunk_tokens, chunk_bytes)
    return min(int(pinned_bytes), host_budget if host_budget is not None else int(pinned_bytes))


def resolve_request_bytes(request_bytes, budget: int, longest: int) -> int:
    """One request's share of the host budget: the setting, never more than the budget; for 'auto' a quarter of the
    budget, or what the longest request pages out (``longest``) if that is more, and never more than half the budget,
    so that no one request holds it all."""
    if request_bytes == "auto":
        return min(budget // 2, max(budget // 4, longest))
    return min(int(request_bytes), budget)


def ledger_path(path: str) -> str:
    """The host ledger's file; where its folder does not exist (no ``/dev/shm``), the same name in the temp folder."""
    folder = os.path.dirname(path) or "."
    return path if os.path.isdir(folder) else os.path.join(tempfile.gettempdir(), os.path.basename(path))
