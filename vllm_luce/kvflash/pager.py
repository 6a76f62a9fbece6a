"""KVFlash pager core: bounded GPU residency for one request's full-attention KV (pure torch).

A request's KV is cut into logical chunks of ``chunk_tokens`` tokens. At most ``pool_chunks`` of
them are resident, in physical pool slots; the rest live in a host backing store. Paging copies
the chunk's K and V bytes unchanged: RoPE is already applied to cached keys, so a chunk is valid in
any slot, and out-then-in is bit-exact.

Never evicted: the first ``sink_chunks`` chunks (attention sinks), and the recent tail. The tail
is the last ``recent_chunks`` chunks, or more if a sliding window needs them; it includes the chunk
being written. Everything else is evictable; a policy (``policies.py``) ranks it. Reselection (page in
the best-scored host chunks, evicting the worst resident ones) is due every
``tau = max(tau_min, history / 45)`` decoded tokens.

The store is an interface so the same logic drives torch tensors in tests and vLLM's paged KV
cache in the worker binding: ``read(slot) -> tensor`` and ``write(slot, tensor)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import torch


class KVFlashConfigError(ValueError):
    pass


@dataclass(frozen=True)
class PagerConfig:
    pool_tokens: int
    chunk_tokens: int = 64
    sink_chunks: int = 1
    recent_chunks: int = 4
    sliding_window: int | None = None  # tokens; the recent tail covers it
    tau_min: int = 16  # decoded tokens between reselections, at least

    def __post_init__(self):
        c = self.chunk_tokens
        if not isinstance(self.pool_tokens, int) or isinstance(self.pool_tokens, bool) or self.pool_tokens <= 0 \
                or self.pool_tokens % c:
            raise KVFlashConfigError(f"luce.kvflash.pool_tokens: got {self.pool_tokens!r}; expected a positive "
                                     f"multiple of chunk_tokens ({c})")
        if self.pool_tokens // c < self.min_pool_chunks:
            raise KVFlashConfigError(
                f"luce.kvflash.pool_tokens: got {self.pool_tokens}; expected at least {self.min_pool_chunks * c} "
                f"({self.sink_chunks} sink + {self.recent_tail_chunks} recent chunks + 1 evictable chunk of {c} tokens)")

    @property
    def pool_chunks(self) -> int:
        return self.pool_tokens // self.chunk_tokens

    @property
    def recent_tail_chunks(self) -> int:
        window = 0 if not self.sliding_window else math.ceil(self.sliding_window / self.chunk_tokens) + 1
        return max(self.recent_chunks, window)

    @property
    def min_pool_chunks(self) -> int:
        return self.sink_chunks + self.recent_tail_chunks + 1


class SlotStore(Protocol):
    def read(self, slot: int) -> torch.Tensor: ...
    def write(self, slot: int, data: torch.Tensor) -> None: ...


class TensorStore:
    """A pool of ``slots`` chunk-sized slots in one tensor ``[slots, ...]`` (tests, benchmarks)."""

    def __init__(self, slots: int, chunk_shape: tuple[int, ...], dtype=torch.bfloat16, device="cpu"):
        self.data = torch.zeros((slots, *chunk_shape), dtype=dtype, device=device)

    def read(self, slot: int) -> torch.Tensor:
        return self.data[slot]

    def write(self, slot: int, data: torch.Tensor) -> None:
        self.data[slot].copy_(data)


@dataclass
class PagerStats:
    page_outs: int = 0
    page_ins: int = 0
    reselections: int = 0


@dataclass
class RequestPager:
    """Residency of one request. ``slots`` are the pool slots this request owns (its block budget)."""

    config: PagerConfig
    store: SlotStore
    slots: list[int]
    num_tokens: int = 0
    resident: dict[int, int] = field(default_factory=dict)  # logical chunk -> pool slot
    host: dict[int, torch.Tensor] = field(default_factory=dict)  # logical chunk -> paged-out bytes
    stats: PagerStats = field(default_factory=PagerStats)
    decoded_since_reselect: int = 0
    last_used: dict[int, int] = field(default_factory=dict)  # logical chunk -> token count when last used
    summaries: dict[int, torch.Tensor] = field(default_factory=dict)  # chunk -> [layers, kv_heads, head_dim]

    def __post_init__(self):
        if len(self.slots) != self.config.pool_chunks:
            raise ValueError(f"a request's pool has {self.config.pool_chunks} slots, got {len(self.slots)}")
        self.free = list(reversed(self.slots))

    # -------------------------------------------------------------- structure

    @property
    def num_chunks(self) -> int:
        return math.ceil(self.num_tokens / self.config.chunk_tokens)

    def protected(self) -> set[int]:
        n, cfg = self.num_chunks, self.config
        return set(range(min(cfg.sink_chunks, n))) | set(range(max(0, n - cfg.recent_tail_chunks), n))

    def evictable(self) -> list[int]:
        keep = self.protected()
        return sorted(c for c in self.resident if c not in keep)

    def slot_of(self, chunk: int) -> int | None:
        return self.resident.get(chunk)

    def page_table(self) -> list[tuple[int, int]]:
        """(pool slot, first logical position) of every resident chunk, in logical order."""
        return [(self.resident[c], c * self.config.chunk_tokens) for c in sorted(self.resident)]

    # -------------------------------------------------------------- growth

    def append(self, num_new_tokens: int, policy) -> list[int]:
        """Account for ``num_new_tokens`` written at the end; returns the slots of new chunks (in order).
        A new chunk takes a free slot, else the slot of the policy's lowest-ranked evictable chunk."""
        first_new = self.num_chunks  # a partial last chunk is resident already
        self.num_tokens += num_new_tokens
        new_chunks = list(range(first_new, self.num_chunks))
        new_slots = []
        for chunk in new_chunks:
            # Chunks allocated by this call hold no data yet: they are never the victim.
            slot = self.free.pop() if self.free else self._evict(policy, exclude=set(new_chunks))
            self.resident[chunk] = slot
            self.last_used[chunk] = self.num_tokens
            new_slots.append(slot)
        return new_slots

    def touch(self, chunks) -> None:
        """Chunks the current step attended to (recency for LRU)."""
        for c in chunks:
            self.last_used[c] = self.num_tokens

    def note_decoded(self, tokens: int = 1) -> None:
        self.decoded_since_reselect += tokens

    def reselect_due(self) -> bool:
        return self.decoded_since_reselect >= max(self.config.tau_min, self.num_tokens // 45)

    # -------------------------------------------------------------- paging

    def _evict(self, policy, exclude: set[int] = frozenset()) -> int:
        candidates = [c for c in self.evictable() if c not in exclude]
        if not candidates:
            raise RuntimeError(f"KVFlash: no evictable chunk; write at most "
                               f"{(self.config.pool_chunks - self.config.sink_chunks - 1) * self.config.chunk_tokens} "
                               "tokens per step into a pool of this size")
        scores = policy.scores(self, candidates)
        victim = candidates[int(torch.as_tensor(scores).argmin())]
        return self.page_out(victim)

    def page_out(self, chunk: int) -> int:
        """Copy the chunk to the host store, bit for bit; returns the slot it freed."""
        slot = self.resident.pop(chunk)
        self.host[chunk] = self.store.read(slot).detach().to("cpu", copy=True)
        self.stats.page_outs += 1
        return slot

    def page_in(self, chunk: int, slot: int) -> None:
        self.store.write(slot, self.host.pop(chunk))
        self.resident[chunk] = slot
        self.stats.page_ins += 1

    def reselect(self, policy) -> list[int]:
        """Swap in host chunks that outscore resident evictable ones; returns the chunks paged in."""
        self.decoded_since_reselect = 0
        self.stats.reselections += 1
        if not self.host:
            return []
        resident = self.evictable()
        away = sorted(self.host)
        if not resident:
            return []
        scores = torch.as_tensor(policy.scores(self, resident + away), dtype=torch.float32)
        res_scores, host_scores = scores[: len(resident)], scores[len(resident):]
        order_res = torch.argsort(res_scores)  # worst resident first
        order_host = torch.argsort(host_scores, descending=True)  # best host first
        paged_in = []
        for r, h in zip(order_res.tolist(), order_host.tolist()):
            if host_scores[h] <= res_scores[r]:
                break
            slot = self.page_out(resident[r])
            self.page_in(away[h], slot)
            paged_in.append(away[h])
        return paged_in

    def release(self) -> int:
        """Free everything (finished or aborted request); returns the host bytes returned."""
        freed = sum(t.numel() * t.element_size() for t in self.host.values())
        self.host.clear()
        self.resident.clear()
        self.last_used.clear()
        self.summaries.clear()
        self.free = list(reversed(self.slots))
        return freed
