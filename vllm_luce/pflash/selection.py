"""PFlash selection: which chunks of a long prompt the target prefills (pure torch, no vLLM).

Given one importance score per prompt token (``scoring.py``), the prompt is cut into chunks of
``chunk_tokens`` (32) and a budget of ``n_keep = max(1, floor(n_chunks * keep_ratio))`` chunks is
filled in this order:

1. forced head (8 chunks) and tail (24 chunks): the instructions and the question. When the two do
   not fit in the budget they are scaled down in proportion, keeping at least one tail chunk;
2. lexical anchors: every distinct 4-gram of the last 96 tokens (the "query") that occurs in the
   body (the prompt before the query) between 1 and ``max_hits`` times forces the chunks within
   ``radius`` of each occurrence. The query's latest 4-grams go first (the question ends the prompt);
   anchors may take at most ``n_keep`` chunks beyond the head and tail, so a prompt can exceed its
   budget by anchors only, never by more than 2x;
3. the remaining budget goes to the highest-scoring chunks (chunk score = mean token score).

Kept chunks are emitted in prompt order as merged token spans. Positions are not preserved: the
target prefills the kept tokens as a new, shorter prompt (as Lucebox does).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

# (n_chunks below which the tier applies, radius in chunks, max hits per 4-gram); Lucebox's
# anchor_params.h tiers, which fixed its 64K needle-in-a-haystack cliff.
ANCHOR_TIERS: tuple[tuple[float, int, int], ...] = ((1024, 2, 8), (2048, 4, 16), (math.inf, 8, 32))


@dataclass(frozen=True)
class SelectionConfig:
    chunk_tokens: int = 32
    keep_ratio: float = 0.05
    # Piecewise-linear keep ratio by prompt length: ((tokens, ratio), ...) sorted by tokens, clamped
    # at both ends. Empty: keep_ratio for every length.
    keep_curve: tuple[tuple[int, float], ...] = ()
    head_chunks: int = 8
    tail_chunks: int = 24
    anchors: bool = True
    anchor_ngram: int = 4
    anchor_query_tokens: int = 96

    def ratio_for(self, prompt_tokens: int) -> float:
        curve = self.keep_curve
        if not curve:
            return self.keep_ratio
        if prompt_tokens <= curve[0][0]:
            return curve[0][1]
        for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
            if prompt_tokens <= x1:
                return y0 + (y1 - y0) * (prompt_tokens - x0) / (x1 - x0)
        return curve[-1][1]


@dataclass
class Selection:
    kept_chunks: list[int]           # ascending chunk indices
    spans: list[tuple[int, int]]     # merged [start, end) token ranges, ascending
    n_chunks: int
    n_keep: int                      # the budget
    forced: dict[str, list[int]] = field(default_factory=dict)  # "head", "tail", "anchor" -> chunks

    @property
    def kept_tokens(self) -> int:
        return sum(end - start for start, end in self.spans)

    def gather(self, token_ids: list[int]) -> list[int]:
        return [t for start, end in self.spans for t in token_ids[start:end]]


def anchor_tier(n_chunks: int) -> tuple[int, int]:
    """(radius, max_hits) for a prompt of ``n_chunks`` chunks."""
    return next((radius, hits) for below, radius, hits in ANCHOR_TIERS if n_chunks < below)


def chunk_scores(token_scores: torch.Tensor, chunk_tokens: int) -> torch.Tensor:
    """Mean token score per chunk (the last chunk may be partial)."""
    s = token_scores.float().flatten()
    n_chunks = -(-s.numel() // chunk_tokens)
    if n_chunks == 0:
        return s.new_zeros(0)
    padded = torch.zeros(n_chunks * chunk_tokens, dtype=s.dtype, device=s.device)
    padded[: s.numel()] = s
    counts = torch.full((n_chunks,), float(chunk_tokens), device=s.device)
    counts[-1] = s.numel() - (n_chunks - 1) * chunk_tokens
    return padded.view(n_chunks, chunk_tokens).sum(1) / counts


def gram_keys(ids: torch.Tensor, n: int) -> torch.Tensor:
    """A 64-bit key per n-gram start (polynomial hash, wrapping): equal n-grams get equal keys."""
    keys = torch.zeros(ids.numel() - n + 1, dtype=torch.int64)
    for j in range(n):
        keys = keys * 1_000_003 + ids[j:j + keys.numel()]
    return keys


def anchor_chunks(token_ids: torch.Tensor, cfg: SelectionConfig, n_chunks: int,
                  tier: tuple[int, int] | None = None) -> list[int]:
    """Chunks forced by exact n-gram matches of the query (last tokens) in the body, latest n-gram first.
    ``tier``: (radius, max_hits) instead of the prompt-length tier. One pass over the body's n-gram keys: a loop of
    whole-body comparisons per query n-gram, and ``torch.isin``, take far longer at 64K tokens (docs/benchmarks.md,
    "Measurements behind design choices in the code")."""
    n, q = cfg.anchor_ngram, cfg.anchor_query_tokens
    ids = token_ids.flatten().long().cpu()
    body_len = ids.numel() - q
    if body_len < n or q < n:
        return []
    radius, max_hits = tier or anchor_tier(n_chunks)
    body = ids[:body_len]
    query_keys = gram_keys(ids[body_len:], n).flip(0).tolist()  # the question ends the prompt: latest first
    body_keys = gram_keys(body, n)
    wanted = torch.tensor(sorted(set(query_keys)))
    at = torch.searchsorted(wanted, body_keys).clamp_(max=wanted.numel() - 1)
    found = (wanted[at] == body_keys).nonzero().flatten()  # faster than torch.isin (the docstring)
    positions: dict[int, list[int]] = {}
    for pos, key in zip(found.tolist(), body_keys[found].tolist()):
        positions.setdefault(key, []).append(pos)
    query, seen = ids[body_len:], set()
    out: dict[int, None] = {}
    for j, key in enumerate(query_keys):
        if key in seen:
            continue
        seen.add(key)
        candidates = positions.get(key, [])
        if len(candidates) <= 2 * max_hits:  # beyond that no hash collision can bring it within max_hits
            gram = query[len(query) - n - j:][:n]
            candidates = [p for p in candidates if torch.equal(body[p:p + n], gram)]
        if 1 <= len(candidates) <= max_hits:
            for pos in candidates:
                c = pos // cfg.chunk_tokens
                for k in range(max(0, c - radius), min(n_chunks, c + radius + 1)):
                    out.setdefault(k)
    return list(out)


def select(token_scores: torch.Tensor, token_ids: torch.Tensor | list[int], cfg: SelectionConfig) -> Selection:
    """The kept chunks and spans of one prompt (``token_scores`` and ``token_ids`` of equal length)."""
    ids = torch.as_tensor(token_ids).flatten()
    s = token_scores.flatten()
    if s.numel() != ids.numel() or s.numel() == 0:
        raise ValueError(f"select: {s.numel()} scores for {ids.numel()} tokens; expected equal, non-zero")
    C = cfg.chunk_tokens
    n_chunks = -(-ids.numel() // C)
    n_keep = min(n_chunks, max(1, math.floor(n_chunks * cfg.ratio_for(ids.numel()) + 1e-9)))
    head, tail = cfg.head_chunks, cfg.tail_chunks
    if head + tail >= n_keep:  # scale down in proportion, keep the question's chunk
        tail = max(1, round(n_keep * tail / max(1, head + tail)))
        head = n_keep - tail
    forced = {"head": list(range(min(head, n_chunks))),
              "tail": list(range(max(0, n_chunks - tail), n_chunks))}
    kept: dict[int, None] = dict.fromkeys(forced["head"] + forced["tail"])
    forced["anchor"] = []
    if cfg.anchors:
        for c in anchor_chunks(ids, cfg, n_chunks):
            if len(forced["anchor"]) >= n_keep:
                break
            if c not in kept:
                kept.setdefault(c)
                forced["anchor"].append(c)
    room = n_keep - len(kept)
    if room > 0:
        order = torch.argsort(chunk_scores(s, C), descending=True, stable=True).tolist()
        for c in order:
            if room == 0:
                break
            if c not in kept:
                kept.setdefault(c)
                room -= 1
    chunks = sorted(kept)
    return Selection(chunks, merge_spans(chunks, C, ids.numel()), n_chunks, n_keep, forced)


def merge_spans(chunks: list[int], chunk_tokens: int, total: int) -> list[tuple[int, int]]:
    """Ascending chunk indices -> merged [start, end) token spans clamped to ``total``."""
    spans: list[tuple[int, int]] = []
    for c in chunks:
        start, end = c * chunk_tokens, min(total, (c + 1) * chunk_tokens)
        if spans and spans[-1][1] == start:
            spans[-1] = (spans[-1][0], end)
        else:
            spans.append((start, end))
    return spans
