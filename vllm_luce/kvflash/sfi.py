"""SFI (Slow-Fast Inference, arXiv 2603.12038; Lucebox PR #163) as a KVFlash selection mode (pure torch).

All of a request's full-attention KV stays resident. Decode steps are *fast*: attention reads the
sinks, the recent tail and the ``k`` middle chunks the policy scores highest, ``k`` filling the
budget ``pool_tokens``. Every ``tau = max(tau_min, context / 45)`` decoded tokens one *slow* step
attends to everything, and the queries of that dense step choose the next selection. Prefill steps
are always dense.

Fast steps copy nothing. The request's blocks hold its chunks in a permuted order: the selected
middle chunks (and the sinks) sit right before the recent tail, so a fast step is vLLM's ordinary
paged attention over a *suffix* of the request's block row, starting at the block that holds the
first selected chunk. That is exact:
  * RoPE is baked into cached keys, and a step's causal mask concerns only its own tokens, which
    are the last of the row; the order of earlier keys does not change attention (dense steps over
    the permuted row are exact too, up to summation order);
  * chunks from the recent tail on are never moved: position ``p`` holds chunk ``p`` there, so new
    tokens go where vLLM's own slot mapping puts them, and rejected drafts only rewrite the tail.
A refresh swaps newly selected chunks into the suffix and unselected ones out (device copies of at
most ``k + sinks`` chunks each way). The suffix starts on a cache-block boundary, so a fast step
reads up to one block minus one chunk more than the budget; between refreshes it also keeps the
chunks that aged out of the recent tail.

The interface is the pager's (``prepare``, ``resident_tokens``, ``release``), plus
``skipped_tokens``: how many leading tokens of the row this step's attention skips (0: dense).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from vllm_luce.kvflash.pager import PagerConfig
from vllm_luce.kvflash.pool_store import PagerStats, PoolStore, summarize


@dataclass
class RequestSelection:
    config: PagerConfig
    store: PoolStore
    align_tokens: int = 1  # a fast step's suffix starts at a multiple of this (the cache block size)
    num_tokens: int = 0
    req_id: str = ""
    order: list[int] = field(default_factory=list)  # logical chunk at each chunk position of the row
    window: int = 0  # first chunk position of the suffix fast steps read
    skip: int = 0  # leading row tokens this step's attention skips
    selected: list[int] = field(default_factory=list)  # middle chunks of the current selection
    select_pending: bool = True  # choose a selection at the next fast step (after prefill / a slow step)
    decoded_since_refresh: int = 0
    summaries: dict[int, torch.Tensor] = field(default_factory=dict)  # chunk -> its summary (the policy's form)
    queries: torch.Tensor | None = None  # [layers, q_heads, head_dim] of the latest token(s) (query_window.py)
    query_tokens: torch.Tensor | None = None  # [tokens, layers, q_heads, head_dim]: the window ``queries`` holds
    last_used: dict[int, int] = field(default_factory=dict)  # chunk -> token count when written (LRU)
    stats: PagerStats = field(default_factory=PagerStats)
    host: dict = field(default_factory=dict)  # never holds anything: SFI keeps all KV resident

    def chunks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.config.chunk_tokens)

    @property
    def num_chunks(self) -> int:
        return self.chunks_for(self.num_tokens)

    @property
    def tail_start(self) -> int:
        """First chunk of the recent tail (chunks from here on are never moved)."""
        return max(0, self.num_chunks - self.config.recent_tail_chunks)

    @property
    def resident(self) -> list[int]:
        """Chunks this step's attention reads."""
        return self.order[self.skip // self.config.chunk_tokens:]

    def resident_tokens(self) -> int:
        return self.num_tokens - self.skip

    def skipped_tokens(self) -> int:
        return self.skip

    def host_bytes(self) -> int:
        return 0

    def chunk_keys(self, chunks: list[int]) -> torch.Tensor:
        """[C, layers, chunk, kv_heads, head] keys of full chunks (the ``attention`` policy)."""
        position = {c: p for p, c in enumerate(self.order)}
        return self.store.keys_at([position[c] for c in chunks])

    def wants_queries(self, window: int) -> bool:
        """Every step's queries: a slow step's choose the next selection (``RequestPager.wants_queries``'s twin)."""
        return True

    def refresh_due(self) -> bool:
        return self.decoded_since_refresh >= self.config.reselect_interval(self.num_tokens)

    # -------------------------------------------------------------- one step

    def prepare(self, start: int, num_new: int, policy, decoded: int = 0, prompt_end: bool = False) -> list[int]:
        """Register tokens ``start .. start + num_new - 1``, decide whether this step is fast, and
        return the row offsets of the new tokens (their logical positions: the tail is in place).
        ``prompt_end`` is the pager's; SFI prefills densely, so it has nothing to reselect there."""
        self._truncate(start)
        if getattr(policy, "needs_summaries", False):  # before this step's tokens: they are not written yet
            self._summarize_full_chunks(policy)
        self.num_tokens = start + num_new
        for chunk in range(len(self.order), self.num_chunks):
            self.order.append(chunk)
            self.last_used[chunk] = self.num_tokens
        self.skip = 0
        fits = self.num_chunks <= self.config.pool_chunks
        if decoded == num_new > 0 and not fits:  # a decode step over a context larger than the budget
            self.decoded_since_refresh += decoded
            if self.refresh_due():  # slow step: dense; its queries choose the next selection
                self.decoded_since_refresh = 0
                self.select_pending = True
                self.stats.dense_steps += 1
            else:
                if self.select_pending:
                    self._select(policy)
                self.skip = self.window * self.config.chunk_tokens // self.align_tokens * self.align_tokens
                self.stats.sparse_steps += 1
                self.stats.attended_tokens += self.resident_tokens()
                self.stats.context_tokens += self.num_tokens
        elif decoded and not fits:
            self.stats.dense_steps += 1
        return list(range(start, start + num_new))

    # -------------------------------------------------------------- internals

    def _truncate(self, start: int) -> None:
        if start >= self.num_tokens:
            if start > self.num_tokens:
                raise ValueError(f"KVFlash SFI: tokens {self.num_tokens}..{start - 1} were never written")
            return
        first = start // self.config.chunk_tokens  # the chunk rewritten from here on must be in place
        if any(self.order[p] != p for p in range(first, len(self.order))):
            raise RuntimeError(f"KVFlash SFI: cannot rewrite from token {start}: chunk {first} was moved "
                               f"(only the recent tail of {self.config.recent_tail_chunks} chunks is rewritable)")
        keep = self.chunks_for(start)
        del self.order[keep:]
        for c in [c for c in self.summaries if c >= first]:
            del self.summaries[c]
        self.num_tokens = start

    def _summarize_full_chunks(self, policy) -> None:
        full = self.num_tokens // self.config.chunk_tokens
        for position, chunk in enumerate(self.order[:full]):
            if chunk not in self.summaries:
                self.summaries[chunk] = summarize(policy, self.store, position)

    def _select(self, policy) -> None:
        """Score the middle chunks and move the sinks and the top ``k`` right before the tail."""
        t0 = time.perf_counter()
        self.select_pending = False
        self.stats.reselections += 1
        cfg, tail = self.config, self.tail_start
        sinks = list(range(min(cfg.sink_chunks, tail)))
        middle = list(range(len(sinks), tail))
        k = max(0, cfg.pool_chunks - len(sinks) - (self.num_chunks - tail))
        if len(middle) > k:
            scores = torch.as_tensor(policy.scores(self, middle), dtype=torch.float32)
            best = torch.argsort(scores, descending=True, stable=True)[:k].tolist()
            self.selected = sorted(middle[i] for i in best)
        else:
            self.selected = middle
        chosen = set(sinks) | set(self.selected)
        self.window = tail - len(chosen)
        position = {c: p for p, c in enumerate(self.order)}
        leaving = [p for p in range(self.window, tail) if self.order[p] not in chosen]
        entering = sorted(position[c] for c in chosen if position[c] < self.window)
        moves = [(dst, src) for dst, src in zip(leaving, entering)] + list(zip(entering, leaving))
        if moves:
            self.store.rearrange(moves, [])
            for a, b in zip(leaving, entering):
                self.order[a], self.order[b] = self.order[b], self.order[a]
            self.stats.moves += len(moves)
        self.stats.reselect_s += time.perf_counter() - t0

    def release(self) -> int:
        for d in (self.summaries, self.last_used):
            d.clear()
        self.order.clear()
        self.selected.clear()
        self.num_tokens = self.window = self.skip = 0
        return 0
