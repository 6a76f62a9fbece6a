"""The queries a KVFlash reselection scores with: those of the request's last ``query_window`` tokens (pure torch).

A single token's query finds little: at a prompt's end the pager reselects with the queries of the token
before the last one (``prompt_end.py``), which in ``KEY_123 = "`` is `` =``, a token that occurs all over code.
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


def push_queries(pager, queries: torch.Tensor, window: int) -> None:
    """``queries`` ``[n, layers, q_heads, head]`` of the request's latest ``n`` tokens, oldest first: keep the
    last ``window`` tokens (with those held before) in ``pager.query_tokens`` and set ``pager.queries``."""
    held = getattr(pager, "query_tokens", None)
    recent = queries[-window:]
    if held is not None and len(recent) < window and held.shape[1:] == recent.shape[1:]:
        recent = torch.cat([held[len(recent) - window:], recent])
    pager.query_tokens = recent
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
