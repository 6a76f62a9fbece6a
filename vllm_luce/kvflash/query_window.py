"""The queries a KVFlash reselection scores with: those of the request's last ``query_window`` tokens (pure torch).

A single token's query finds little: at a prompt's end the pager reselects with the queries of the token
before the last one (``decisions.py``), which in ``KEY_123 = "`` is `` =``, a token that occurs all over code.
The tokens before it (the key's digits) are the ones whose queries point at the needle. Offline on the trained
fixture (``benchmarks/kvflash_summary_study.py``, 20 needle prompts per length at 2K-8K), the needle's chunk
ranked among the 3 best of 27-123 for 10-45% of prompts with that one token's queries and 90-100% with the last
8 tokens', scored by the salient policy's two keys (one key: 15-25% and 75-95%); by key bounds 50-100% and 65-95%
(``docs/fidelity.md``).

Every policy scores ``pager.queries`` ``[layers, query rows, head]`` as query heads grouped over KV heads (the
maximum over a group's rows, or its mean for none). The window keeps that form: each query head's tokens are
adjacent rows (head ``h``'s token ``t`` at row ``h * w + t``, ``w`` the tokens held), so row ``// (group * w)`` is
still the KV head, and a policy takes the maximum over the window as it does over the group's heads. With a
window of 1 the queries are exactly the latest token's ``[layers, q_heads, head]``.
"""

from __future__ import annotations

import torch


def push_queries(pager, queries: torch.Tensor, window: int, keep: int | None = None) -> None:
    """``queries`` ``[n, layers, q_heads, head]`` of the request's latest ``n`` tokens, oldest first, the last of
    them at position ``pager.num_tokens - 1``: hold the last ``keep`` tokens' (``window`` by default; more when a
    verify step's drafts may be rejected, so that the window before the next decision is whole after
    ``trim_queries``) with those held before when they adjoin, and set ``pager.queries`` to the last ``window``.
    What is held is the request's own copy: a view would keep the step's whole batch of queries alive on the device
    (``device_budget.py`` counts each request's own)."""
    keep = max(keep or window, window)
    held, end = getattr(pager, "query_tokens", None), pager.num_tokens
    recent = queries[-keep:]
    adjoins = held is not None and getattr(pager, "query_end", None) == end - len(recent)
    if adjoins and len(recent) < keep and held.shape[1:] == recent.shape[1:]:
        recent = torch.cat([held[len(recent) - keep:], recent])
    else:
        recent = recent.clone()
    pager.query_tokens, pager.query_end, pager.query_window = recent, end, window
    _set_queries(pager)


def trim_queries(pager, start: int) -> None:
    """Positions from ``start`` on are gone (rejected drafts, a restart): so are their queries."""
    held, end = getattr(pager, "query_tokens", None), getattr(pager, "query_end", None)
    if held is None or end is None or end <= start:
        return
    kept = len(held) - (end - start)
    pager.query_tokens, pager.query_end = (held[:kept], start) if kept > 0 else (None, None)
    _set_queries(pager)


def _set_queries(pager) -> None:
    held = pager.query_tokens
    if held is None:
        pager.queries = None
        return
    recent = held[-pager.query_window:]
    tokens, layers, heads, head = recent.shape
    pager.queries = recent.permute(1, 2, 0, 3).reshape(layers, heads * tokens, head)


def window_rows(query_start_loc, num_reqs: int, window: int):
    """For a step whose requests have ``query_start_loc`` token ranges: the rows of each request's last
    ``min(window, its tokens)`` tokens (flat, int64) and each request's ``(first, count)`` in them; ``None`` when
    no request has more than one token (a decode step: the latest-token buffer holds everything)."""
    import numpy as np

    starts, ends = np.asarray(query_start_loc[:num_reqs]), np.asarray(query_start_loc[1 : num_reqs + 1])
    counts = np.minimum(ends - starts, window)
    if window <= 1 or not (counts > 1).any():
        return None
    rows = np.concatenate([np.arange(e - c, e) for e, c in zip(ends, counts)]).astype(np.int64)
    firsts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return rows, list(zip(firsts.tolist(), counts.tolist()))
