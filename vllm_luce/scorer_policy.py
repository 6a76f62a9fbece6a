"""KVFlash's drafter-scorer policy (``luce.kvflash.policy: scorer``), the seam where KVFlash uses PFlash: PFlash's
drafter scores the request's context and each KVFlash chunk gets the mean importance of its tokens (no vLLM import).
Attached by ``bind`` once both features are bound on a runner (either model runner); KVFlash imports
nothing of it.

PFlash's lexical anchors rank first, as in PFlash's selection: a chunk holding an exact 4-gram of
the context's last 96 tokens (the question and what has been generated since), found at most 8 times
before them, outranks every attention score, latest 4-gram first. On the needle fixture
(docs/fidelity.md) this keeps the needle's chunk resident, which attention scores alone did not.

A scoring pass reads the whole prompt, even while it is still being prefilled (vLLM has all of it,
and its end is the question, which decides what matters: scoring only the part prefilled so far
evicted the needle before the question arrived), and then the generated tokens. It is refreshed
when the context has grown by at least ``refresh_tokens`` since the last pass; chunks newer than the
last pass score +inf (they are recent: keep them).
"""

from __future__ import annotations

from typing import Callable

import torch

from vllm_luce.pflash.selection import SelectionConfig, anchor_chunks, chunk_scores

ANCHOR_TIER = (0, 8)  # (radius, max hits): only the chunk holding the match, as KVFlash chunks are large


class DrafterChunkScorer:
    def __init__(self, token_scores: Callable[[list[int]], torch.Tensor],
                 tokens_of: Callable[[str], tuple[list[int], int]], chunk_tokens: int, refresh_tokens: int):
        """``tokens_of(req_id)`` -> (the request's prompt + output token ids, prompt length)."""
        self.token_scores, self.tokens_of = token_scores, tokens_of
        self.chunk_tokens, self.refresh_tokens = chunk_tokens, refresh_tokens
        self.cache: dict[str, tuple[int, torch.Tensor]] = {}  # req_id -> (tokens scored, chunk scores)
        self.passes = 0

    def __call__(self, pager, chunks: list[int]) -> torch.Tensor:
        req_id, n = pager.req_id, pager.num_tokens
        scored, per_chunk = self.cache.get(req_id, (0, None))
        if per_chunk is None or n - scored >= self.refresh_tokens:
            ids, prompt_len = self.tokens_of(req_id)
            ids = ids[: max(n, prompt_len)]  # during prefill, the whole prompt: its end is the question
            # complete chunks only: a partial last chunk is recent and never scored
            per_chunk = chunk_scores(self.token_scores(ids), self.chunk_tokens)[: len(ids) // self.chunk_tokens]
            anchors = anchor_chunks(torch.tensor(ids), SelectionConfig(chunk_tokens=self.chunk_tokens),
                                    per_chunk.numel(), tier=ANCHOR_TIER)
            top = float(per_chunk.max()) + 1.0 if per_chunk.numel() else 1.0
            for rank, c in enumerate(a for a in anchors if a < per_chunk.numel()):
                per_chunk[c] = top + len(anchors) - rank  # above every attention score, latest match first
            self.cache[req_id] = (len(ids), per_chunk)
            self.passes += 1
        full = per_chunk.numel()
        return torch.tensor([float(per_chunk[c]) if c < full else float("inf") for c in chunks])

    def release(self, req_id: str) -> None:
        self.cache.pop(req_id, None)


def bind(runner, luce) -> None:
    """The seam's binding, after KVFlash's and PFlash's (its row in ``vllm_luce/hooks.py`` follows theirs): where
    ``luce.kvflash.policy`` is 'scorer', PFlash's drafter (loaded on this runner by PFlash's binding) becomes the
    chunk scorer of KVFlash's runtime, reading each request's tokens through the runtime's ``tokens_of`` (V1's or
    V2's request states)."""
    runtime = getattr(runner, "luce_kvflash", None)
    if runtime is None or runtime.policy.name != "scorer":
        return
    service = getattr(runner, "luce_pflash", None)
    if service is None:  # not rank 0: every rank would need the same scores
        raise RuntimeError("luce.kvflash.policy 'scorer' with tensor/pipeline parallelism is not supported yet; "
                           "use 'qk'")
    cfg = runtime.config
    runtime.policy.attach(DrafterChunkScorer(service.scorer.token_scores, runtime.tokens_of, cfg.chunk_tokens,
                                             refresh_tokens=max(cfg.pool_tokens // 2, 256)))
