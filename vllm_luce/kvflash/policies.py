"""KVFlash residency policies: one small interface, ``scores(pager, chunks) -> tensor`` (higher =
keep). The pager evicts the lowest-scored evictable chunk and, on reselection, swaps in host
chunks that outscore resident ones.

* ``LRU``: recency of use (the token count when the chunk was last attended to).
* ``QK``: per chunk, the mean-pooled post-RoPE keys per KV head (``pager.summaries``, filled by
  the worker with the ``chunk_mean`` kernel), scored by cosine with the current queries. Each
  query head is compared with its group's KV head; the score is the maximum over query heads,
  averaged over the full-attention layers.
* ``Scorer``: an external per-chunk score (PFlash's drafter scorer plugs in here).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F


class LRU:
    name = "lru"

    def scores(self, pager, chunks: list[int]) -> torch.Tensor:
        return torch.tensor([float(pager.last_used.get(c, -1)) for c in chunks])


class QK:
    name = "qk"

    def __init__(self):
        self.queries: torch.Tensor | None = None  # [layers, q_heads, head_dim] of the current step

    def observe(self, queries: torch.Tensor) -> None:
        self.queries = queries

    def scores(self, pager, chunks: list[int]) -> torch.Tensor:
        if self.queries is None:
            return LRU().scores(pager, chunks)  # no query seen yet: recency
        missing = [c for c in chunks if c not in pager.summaries]
        if missing:
            raise KeyError(f"QK policy: no key summary for chunks {missing[:8]}")
        keys = torch.stack([pager.summaries[c] for c in chunks]).float()  # [C, L, Hkv, D]
        return qk_scores(self.queries.float(), keys)


def qk_scores(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """queries [L, Hq, D], keys [C, L, Hkv, D] -> [C]: mean over layers of max over query heads of
    cos(query head, its group's key summary)."""
    layers, hq, _ = queries.shape
    hkv = keys.shape[2]
    if hq % hkv:
        raise ValueError(f"{hq} query heads do not group over {hkv} KV heads")
    k = keys.repeat_interleave(hq // hkv, dim=2)  # [C, L, Hq, D]
    cos = (F.normalize(queries, dim=-1)[None] * F.normalize(k, dim=-1)).sum(-1)  # [C, L, Hq]
    return cos.amax(dim=-1).mean(dim=-1)


class Scorer:
    name = "scorer"

    def __init__(self, score_chunks: Callable[[object, list[int]], torch.Tensor]):
        self.score_chunks = score_chunks

    def scores(self, pager, chunks: list[int]) -> torch.Tensor:
        return torch.as_tensor(self.score_chunks(pager, chunks), dtype=torch.float32)


POLICIES = {"lru": LRU, "qk": QK}
