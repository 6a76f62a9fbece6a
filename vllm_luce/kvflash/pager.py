"""KVFlash pager core: bounded residency for one request's full-attention KV (pure torch).

A request's KV is cut into logical chunks of ``chunk_tokens`` tokens. At most ``pool_chunks`` of
them are resident; the rest live in a host backing store. Paging copies a chunk's K and V bytes
unchanged: RoPE is already applied to cached keys, so a chunk is valid at any pool position and
out-then-in is bit-exact.

The pool is kept **compacted**: resident chunks sit in logical order at pool positions 0, 1, ...
(token ``t`` of the chunk at position ``i`` is at pool offset ``i * chunk_tokens + t``). Attention
over the pool is then ordinary paged attention over ``resident_tokens()`` tokens: causal order,
sliding windows (covered by the recent tail) and chunked prefill (new tokens are always the last
ones) all hold, so vLLM's own attention kernels serve the pool unchanged. The price is moving
chunks when the set changes; that happens at the decision positions of ``decisions.py`` (fixed by the request
alone: prefill epochs, the prompt's end, chunk boundaries and reselections while decoding), and costs one pass over
the pool.

Never evicted: the first ``sink_chunks`` chunks (attention sinks) and the recent tail (the last
``recent_chunks`` chunks, or more if a sliding window needs them, including the chunks being
written). A policy (``policies.py``) ranks the rest. Reselection (page in the best-scored host
chunks in place of worse resident ones) comes about every ``history / 45`` decoded tokens (``tau_min`` at least).

Page-out happens on eviction, not by write-through: a chunk is copied to the host once, when it
leaves the pool, and most chunks of a long context never leave it twice. Write-through would copy
every token to the host as it is written (the whole context, not just the evicted part) to save
a copy at eviction time that is no larger.

Cold chunks go to the store's positions beyond the pool first (``cold``): the store's capacity is the request's
block row, and on the GPU the scheduler gives a request blocks beyond its pool while vLLM's KV cache has free blocks
(``admission.py``), so a page-out is a copy inside the GPU and costs no host memory. Only the rest goes to host
memory (``host``). A page-out and a page-in of the same step (a reselection's swap) are one rearrangement of the
store; the swap frees its page-ins' places (cold positions, host bytes) before its page-outs take places.

Host memory is bounded by the scheduler, which holds a request back before it would page out beyond the host
budget (``admission.py``): the pager pages out whatever it evicts. Only with the opt-in ``host_full: "drop"``
does it ask ``host_allowance`` before each host page-out and drop the chunk when that says no (counted and logged):
the request goes on with the sinks, the recent tail and what it still holds, as a streaming-attention cache would.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from vllm_luce.kvflash.choices import ChoiceLog, eviction_margin, swap_margin
from vllm_luce.kvflash.decisions import Decisions
from vllm_luce.kvflash.pool_store import PagerStats, PoolStore, _nbytes, checksum, paged_in_mismatches, summarize
from vllm_luce.kvflash.query_window import trim_queries
from vllm_luce.log import logger

UNKNOWN_PROMPT = 2 ** 62  # a prompt whose end has not come yet


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

    def reselect_interval(self, num_tokens: int) -> int:
        """Decoded tokens between two reselections (SFI: refreshes) of a request of ``num_tokens``: tau, growing
        with the context."""
        return max(self.tau_min, num_tokens // 45)

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

    @property
    def epoch_tokens(self) -> int:
        """Tokens between two prefill decisions (``decisions.py``): those whose chunks fit beside the sinks and the
        recent tail before them, with one chunk to spare for the partial one."""
        return max(1, self.pool_chunks - self.sink_chunks - self.recent_tail_chunks - 1) * self.chunk_tokens

    @property
    def max_step_tokens(self) -> int:
        """Most tokens one step may write: the new chunks (plus the partial one they start in) must
        fit beside the sinks with one chunk to spare. The scheduler caps prefill chunks at this."""
        return (self.pool_chunks - self.sink_chunks - 2) * self.chunk_tokens


@dataclass
class RequestPager:
    config: PagerConfig
    store: PoolStore
    num_tokens: int = 0
    req_id: str = ""  # set by the worker (the drafter-scorer policy looks the request's tokens up)
    resident: list[int] = field(default_factory=list)  # logical chunks, in pool (= logical) order
    host: dict[int, torch.Tensor] = field(default_factory=dict)  # logical chunk -> paged-out bytes
    cold: dict[int, int] = field(default_factory=dict)  # logical chunk -> its store position beyond the pool
    host_nbytes: int = 0  # bytes held in ``host``
    # host_full "drop" only: asked before each host page-out with the chunk's bytes; False drops the chunk.
    host_allowance: Callable[[int], bool] | None = None
    stats: PagerStats = field(default_factory=PagerStats)
    prompt_tokens: int | None = None  # set by the worker; else learnt from ``prepare``'s decoded or prompt_end
    next_reselect: int = -1  # the next reselection position (``decisions.py``); -1: found at the next step
    _decisions: Decisions | None = None
    last_used: dict[int, int] = field(default_factory=dict)  # logical chunk -> token count when last used
    summaries: dict[int, torch.Tensor] = field(default_factory=dict)  # chunk -> its summary (the policy's form)
    queries: torch.Tensor | None = None  # [layers, q_heads, head_dim] of the latest token(s) (query_window.py)
    query_tokens: torch.Tensor | None = None  # [tokens, layers, q_heads, head_dim]: the window ``queries`` holds
    query_end: int | None = None  # the position after the last token ``query_tokens`` holds
    query_window: int = 1
    # Where each chunk's bytes are in the store now; ``resident`` runs ahead of it within a step.
    stored_at: dict[int, int] = field(default_factory=dict)
    cold_free: list[int] = field(default_factory=list)  # cold positions given back (by page-ins, truncation)
    cold_next: int = -1  # the first cold position never used (-1: the pool's end, set on first use)
    cold_moves: list[tuple[int, int]] = field(default_factory=list)  # (cold position, pool position) of this step
    dropped_chunks: set[int] = field(default_factory=set)  # host_full "drop": chunks discarded, still in the context
    reserved_host_chunks: int = 0  # the most host chunks the scheduler has reserved for this request (``admission``)
    room_tokens: int = 0  # the tokens the latest step made room for (``Decisions.room_until``)
    choices: ChoiceLog | None = None  # luce.kvflash.log_choices: each choosing decision (``choices.py``)
    closest_call: float | None = None  # this step's closest choice (``choices.py``), None when it chose nothing
    page_sums: dict[int, torch.Tensor] | None = None  # luce.kvflash.verify_pages: paged-out chunk -> its checksum

    # -------------------------------------------------------------- structure

    def chunks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.config.chunk_tokens)

    @property
    def num_chunks(self) -> int:
        return self.chunks_for(self.num_tokens)

    def protected(self, num_chunks: int | None = None) -> set[int]:
        n, cfg = self.num_chunks if num_chunks is None else num_chunks, self.config
        return set(range(min(cfg.sink_chunks, n))) | set(range(max(0, n - cfg.recent_tail_chunks), n))

    def evictable(self, num_chunks: int | None = None) -> list[int]:
        keep = self.protected(num_chunks)
        return [c for c in self.resident if c not in keep]

    def paged_out(self) -> list[int]:
        """Chunks out of the pool, in either tier, in logical order."""
        return sorted(self.host.keys() | self.cold.keys())

    def resident_tokens(self) -> int:
        """Tokens attention reads: every resident chunk is full except the last chunk of the sequence."""
        if not self.resident:
            return 0
        return (len(self.resident) - 1) * self.config.chunk_tokens + self.num_tokens - \
            (self.num_chunks - 1) * self.config.chunk_tokens

    def skipped_tokens(self) -> int:
        """Leading pool tokens attention skips: none (the compacted pool is read whole; SFI skips some)."""
        return 0

    def pool_offset(self, position: int) -> int:
        """Pool offset of logical token ``position`` (its chunk must be resident)."""
        chunk, within = divmod(position, self.config.chunk_tokens)
        return self.resident.index(chunk) * self.config.chunk_tokens + within

    def page_table(self) -> list[tuple[int, int]]:
        """(pool position, first logical token) of every resident chunk."""
        return [(i, c * self.config.chunk_tokens) for i, c in enumerate(self.resident)]

    # -------------------------------------------------------------- one step

    def prepare(self, start: int, num_new: int, policy, decoded: int = 0, prompt_end: bool = False) -> list[int]:
        """Make room for tokens ``start .. start + num_new - 1`` and return their pool offsets.

        ``start`` below the current length drops the tail (rejected drafts, or a restart after
        preemption): validity is decided by logical position, so nothing needs rolling back.
        ``decoded`` counts the new tokens that are generated (not prompt); ``prompt_end``: this step computes the
        prompt's last token alone. Either tells the prompt's length when ``prompt_tokens`` was not set.
        Evictions and reselections happen at the decision positions of ``decisions.py`` only: at a step's start
        when the scheduler cut it there, else (a step that spans one) at its start, counted in
        ``stats.uncut_decisions``.
        """
        self._truncate(start)
        self.closest_call = None
        if self.prompt_tokens is None and (decoded or prompt_end):
            self.prompt_tokens = start + num_new - decoded if decoded else start + 1
        if getattr(policy, "needs_summaries", False):
            self._summarize_full_chunks(policy)
        plan = self.decisions()
        end = start + num_new
        horizon = plan.next_after(start)
        if end > horizon and end > self.config.pool_tokens:
            self.stats.uncut_decisions += 1
        # At a decision, room for every token up to the next one (a whole prefill epoch), keeping the recent tail
        # before it as well as the one after it; between two decisions none is needed
        at_decision = plan.is_decision(start)
        self.room_tokens = max(end, horizon) if at_decision else end  # = plan.room_until: what the scheduler reserved
        end_chunks = self.chunks_for(self.room_tokens)
        excess = len(self.resident) + end_chunks - self.num_chunks - self.config.pool_chunks
        first_written = start // self.config.chunk_tokens  # this step's chunks have no bytes until it runs
        if excess > 0:
            cut = at_decision and end <= horizon  # else (a step the scheduler did not cut) the tail after it only
            self._evict(policy, excess, end_chunks, first_written, self.num_chunks if cut else end_chunks)
        new_chunks = list(range(self.num_chunks, self.chunks_for(end)))
        self.num_tokens = end
        for chunk in new_chunks:
            self.resident.append(chunk)
            self.last_used[chunk] = self.num_tokens
        loads: list[tuple[int, int]] = []
        if self.next_reselect < 0:
            self.next_reselect = plan.next_reselection(start - 1)
        reselect = start >= self.next_reselect
        if reselect:
            self.stats.uncut_decisions += start > self.next_reselect and bool(self.host or self.cold)
            self.next_reselect = plan.next_reselection(start)
        if reselect and not (self.host or self.cold):
            # Nothing paged out, nothing to choose: no wait for the device and no count (V2's warm-up alone ran
            # about 1,024 such requests, which the reselection metric counted)
            self._relayout({})
        elif reselect:
            settle = getattr(self.store, "settle", None)
            if settle is not None:  # the step before, still on the device, is not the reselection's time
                settle()
            t0 = time.perf_counter()
            loads = self._reselect(policy, first_written)
            self._relayout(dict(loads))
            self.stats.reselect_s += time.perf_counter() - t0
        else:
            self._relayout({})
        self._account()
        if self.choices is not None and self.closest_call is not None:
            self.choices.note(start, self.resident, self.closest_call)
        chunk = self.config.chunk_tokens
        return [self.stored_at[p // chunk] * chunk + p % chunk for p in range(start, end)]

    def decisions(self) -> Decisions:
        """This request's decision positions (``decisions.py``); before its prompt's length is known (the pager's
        tests), those of a prompt that has not ended."""
        prompt = UNKNOWN_PROMPT if self.prompt_tokens is None else self.prompt_tokens
        if self._decisions is None or self._decisions.prompt_tokens != prompt:
            cfg = self.config
            self._decisions = Decisions(cfg.chunk_tokens, cfg.pool_tokens, cfg.epoch_tokens, cfg.tau_min, prompt)
            self.next_reselect = -1  # found again at the next step
        return self._decisions

    def _account(self) -> None:
        """Every chunk of the context is in exactly one place: the pool, a cold position, host memory, or dropped
        (host_full "drop"). Anything else is a lost chunk, counted once per request (``stats.lost``) and logged."""
        placed = len(self.resident) + len(self.cold) + len(self.host) + len(self.dropped_chunks)
        if placed != self.num_chunks and not self.stats.lost:
            self.stats.lost = abs(self.num_chunks - placed)
            logger.error("KVFlash: request %s has %d chunks but places %d (pool %d, cold %d, host %d, dropped %d)",
                         self.req_id, self.num_chunks, placed, len(self.resident), len(self.cold), len(self.host),
                         len(self.dropped_chunks))

    def check_host_reservation(self, reserved_now: int) -> int:
        """After a step: the host chunks the scheduler reserved for this request's length and KV blocks this step
        (``admission.AdmissionConfig.host_chunks``); a reservation is the most a request has needed. Returns the
        host chunks beyond it (counted in ``stats.host_over_reserved``, logged once): 0 unless the pager and scheduler
        disagree."""
        self.reserved_host_chunks = max(self.reserved_host_chunks, reserved_now)
        over = max(0, len(self.host) - self.reserved_host_chunks)
        if over and not self.stats.host_over_reserved:  # the request's first step over: logged once
            logger.error("KVFlash: request %s holds %d chunks in host memory, %d more than the scheduler reserved "
                         "for %d tokens", self.req_id, len(self.host), over, self.num_tokens)
        self.stats.host_over_reserved += over
        return over

    def touch(self, chunks) -> None:
        """Chunks the current step attended to (recency for LRU)."""
        for c in chunks:
            self.last_used[c] = self.num_tokens

    def reselect_due(self) -> bool:
        """Whether the next step, starting where this one ended, reselects."""
        return self.next_reselect >= 0 and self.num_tokens >= self.next_reselect

    def wants_queries(self, window: int) -> bool:
        """Whether the latest step's queries can be in the ``window`` scored at the next decision position (an
        eviction or a reselection): its tokens end within ``window`` tokens of it. Further from it, a step's queries
        would be pushed out unread."""
        return self.decisions().next_after(self.num_tokens - 1) - window < self.num_tokens

    # -------------------------------------------------------------- internals

    def _truncate(self, start: int) -> None:
        if start >= self.num_tokens:
            if start > self.num_tokens:
                raise ValueError(f"KVFlash: tokens {self.num_tokens}..{start - 1} were never written")
            return
        keep = self.chunks_for(start)
        self.resident = [c for c in self.resident if c < keep]
        self.stored_at = {c: i for c, i in self.stored_at.items() if c < keep}
        for c in [c for c in self.host if c >= keep]:
            self.host_nbytes -= _nbytes(self.host.pop(c))
        if self.page_sums is not None:
            self.page_sums = {c: v for c, v in self.page_sums.items() if c < keep}
        for c in [c for c in self.cold if c >= keep]:
            self.cold_free.append(self.cold.pop(c))
        self.dropped_chunks = {c for c in self.dropped_chunks if c < keep}
        trim_queries(self, start)
        if self.choices is not None:
            self.choices.trim(start)
        for c in [c for c in self.summaries if c >= keep - (start % self.config.chunk_tokens > 0)]:
            del self.summaries[c]  # a chunk cut to partial is re-summarised when full again
        self.num_tokens = start

    def _summarize_full_chunks(self, policy) -> None:
        full = self.num_tokens // self.config.chunk_tokens
        for chunk, position in self.stored_at.items():
            if chunk < full and chunk not in self.summaries:
                self.summaries[chunk] = summarize(policy, self.store, position)

    def _evict(self, policy, count: int, num_chunks_after: int, first_written: int, num_chunks_before: int) -> None:
        # A chunk this step writes into (the partial one it starts in) is never the victim, nor one of the recent tail
        # before the step (at a decision) or after it.
        keep = self.protected(num_chunks_before)
        candidates = [c for c in self.evictable(num_chunks_after) if c < first_written and c not in keep]
        if len(candidates) < count:
            raise RuntimeError(
                f"KVFlash: no room for this step's tokens in a pool of {self.config.pool_chunks} chunks; "
                f"write at most {self.config.max_step_tokens} tokens per step")
        scores = torch.as_tensor(policy.scores(self, candidates), dtype=torch.float32)
        if self.choices is not None:
            self._chose(eviction_margin(scores, count))
        for i in torch.argsort(scores, stable=True)[:count].tolist():
            self._page_out(candidates[i])

    def _take_cold(self, capacity: int | None = None) -> int | None:
        """A free cold position of the store (below ``capacity``, by default the store's), or None when every one is
        in use."""
        if self.cold_free:
            return self.cold_free.pop()
        if self.cold_next < 0:
            self.cold_next = self.config.pool_chunks
        if self.cold_next < (self.store.capacity() if capacity is None else capacity):
            self.cold_next += 1
            return self.cold_next - 1
        return None

    def give_back(self, capacity: int) -> int:
        """The store keeps its first ``capacity`` chunk positions only (the scheduler takes back KV blocks it lent for
        cold chunks): each cold chunk beyond them moves to a free cold position below, else to host memory, while the
        store still reads the blocks. Returns the chunks moved to host memory, which the scheduler reserved."""
        self.cold_free = [p for p in self.cold_free if p < capacity]
        if self.cold_next > capacity:
            self.cold_next = capacity
        moves, demoted = [], 0
        for chunk in sorted(c for c, p in self.cold.items() if p >= capacity):
            source, target = self.cold[chunk], self._take_cold(capacity)
            if target is not None:
                self.cold[chunk] = target
                moves.append((target, source))
                continue
            del self.cold[chunk]
            self._copy_to_host(chunk, source)
            demoted += 1
        if moves:  # sources beyond ``capacity``, targets free below it: no move reads another's target
            self.stats.moves += len(moves)
            self.store.rearrange(moves, [])
        self.stats.demotions += demoted
        self._account()
        return demoted

    def _page_out(self, chunk: int) -> None:
        position = self.stored_at.pop(chunk)
        if self.page_sums is not None:  # its bytes are still where they were written
            self.page_sums[chunk] = checksum(self.store.read(position))
        self.resident.remove(chunk)
        cold = self._take_cold()
        if cold is not None:  # moved in the store with this step's rearrangement (``_relayout``)
            self.cold[chunk] = cold
            self.cold_moves.append((cold, position))
            self.stats.page_outs += 1
            self.stats.cold_outs += 1
            return
        nbytes = self.store.chunk_nbytes()
        if self.host_allowance is not None and not self.host_allowance(nbytes):
            # host_full "drop": the budget is spent, so the chunk is dropped (never reselectable again).
            self.stats.dropped += 1
            self.dropped_chunks.add(chunk)
            self.summaries.pop(chunk, None)
            return
        self._copy_to_host(chunk, position)
        self.stats.page_outs += 1

    def _copy_to_host(self, chunk: int, position: int) -> None:
        """The chunk's bytes at store ``position`` into host memory (a page-out, or a cold chunk whose block goes)."""
        read_host = getattr(self.store, "read_host", None)
        data = read_host(position) if read_host else self.store.read(position).detach().to("cpu", copy=True)
        self.host[chunk] = data
        self.host_nbytes += _nbytes(data)
        self.stats.bytes_out += _nbytes(data)

    def _reselect(self, policy, first_written: int) -> list[tuple[int, torch.Tensor | int]]:
        """Swap in paged-out chunks that outscore resident evictable ones written before this step (a step of many
        chunks, as a resumed request's recompute, reselects before its own chunks hold bytes); returns (chunk,
        source) loads: host bytes, or the cold position the chunk leaves. The page-ins give back their places
        before the page-outs take theirs, so a swap never needs room it frees."""
        self.stats.reselections += 1
        resident = [c for c in self.evictable() if c < first_written]
        away = self.paged_out()
        if not resident or not away:
            return []
        scores = torch.as_tensor(policy.scores(self, resident + away), dtype=torch.float32)
        res_scores, away_scores = scores[: len(resident)], scores[len(resident):]
        swaps, gaps = [], []
        worst_first = torch.argsort(res_scores, stable=True).tolist()
        best_first = torch.argsort(away_scores, descending=True, stable=True).tolist()
        for r, h in zip(worst_first, best_first):
            if self.choices is not None:  # log_choices only: no work added where it is off
                gaps.append(float(away_scores[h] - res_scores[r]))
            if away_scores[h] <= res_scores[r]:
                break
            swaps.append((resident[r], away[h]))
        if self.choices is not None:
            self._chose(swap_margin(gaps, scores))
        loads = [(chunk, self._take_back(chunk)) for _, chunk in swaps]
        for victim, _ in swaps:
            self._page_out(victim)
        self.resident = sorted(self.resident + [chunk for chunk, _ in loads])
        return loads

    def _chose(self, margin: float) -> None:
        self.closest_call = margin if self.closest_call is None else min(self.closest_call, margin)

    def _take_back(self, chunk: int) -> torch.Tensor | int:
        """A paged-out chunk's bytes leave their tier: host bytes (returned), or a cold position (freed). A chunk
        paged out to a cold position in this step (a reselection taking back what the step's eviction chose) has
        not moved yet: its page-out is called off and its bytes come from the pool position they never left."""
        self.stats.page_ins += 1
        if chunk in self.cold:
            self.stats.cold_ins += 1
            cold = self.cold.pop(chunk)
            self.cold_free.append(cold)
            pending = next((move for move in self.cold_moves if move[0] == cold), None)
            if pending is not None:
                self.cold_moves.remove(pending)
                return pending[1]
            return cold
        data = self.host.pop(chunk)
        self.host_nbytes -= _nbytes(data)
        self.stats.bytes_in += _nbytes(data)
        return data

    def _relayout(self, loading: dict[int, torch.Tensor | int]) -> None:
        """One pass over the store: this step's page-outs to cold positions, surviving chunks to their new
        positions, and paged-in chunks from cold positions (moves) or host memory (loads). The store reads every
        move's source before it writes, so a cold position freed and taken again within the step is safe."""
        old_position, moves, loads = self.stored_at, list(self.cold_moves), []
        self.cold_moves = []
        for position, chunk in enumerate(self.resident):
            if chunk in loading:
                source = loading[chunk]
                if isinstance(source, int):
                    moves.append((position, source))
                else:
                    loads.append((position, source))
            elif chunk in old_position and old_position[chunk] != position:
                moves.append((position, old_position[chunk]))
        if moves or loads:
            self.stats.moves += len(moves)
            self.store.rearrange(moves, loads)
        self.stored_at = {c: i for i, c in enumerate(self.resident)}
        if self.page_sums is not None and loading:  # verify_pages: they read back as paged out (one sync)
            differ = paged_in_mismatches(self.page_sums, self.store, self.stored_at, list(loading))
            if differ and not self.stats.page_mismatches:
                logger.error("KVFlash: request %s paged %d chunks back in whose bytes differ from those paged out",
                             self.req_id, differ)
            self.stats.page_mismatches += differ

    def release(self) -> int:
        """Free everything (finished or aborted request); returns the host bytes returned."""
        freed = self.host_nbytes
        self.host.clear()
        self.cold.clear()
        self.cold_free.clear()
        self.cold_next, self.cold_moves = -1, []
        self.dropped_chunks.clear()
        self.reserved_host_chunks = 0
        self.host_nbytes = 0
        self.resident.clear()
        self.last_used.clear()
        self.summaries.clear()
        self.stored_at.clear()
        if self.page_sums is not None:
            self.page_sums.clear()
        self.num_tokens = 0
        return freed

    def host_bytes(self) -> int:
        return self.host_nbytes
