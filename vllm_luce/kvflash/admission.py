"""Where a pooled request's cold chunks go, and whether it may run this step (pure; no vLLM import).

The scheduler decides, per request and step, before the worker pages anything out:

* **Free KV blocks first.** A request's chunks beyond its pool go to blocks of vLLM's KV cache beyond the pool's,
  while the cache has free blocks above ``reserve_blocks`` (kept for other requests' pools and vLLM's own
  headroom): a page-out is then a copy inside the GPU, and no host memory is used. The worker puts cold chunks in
  those blocks first (``pager.py``), so both sides count the same chunks (``host_chunks``).
* **Host memory for the rest**, reserved before the step that pages it out: a request whose chunks would not fit
  the host budget (``host_ledger.py``, shared by the host) or its own share (``request_bytes``) is held back: it
  waits (the scheduler skips it for the step, ``scheduler.py``; a holder is preempted only when requests wait for
  this engine's own holders and none of them ran). Nothing is dropped. A request refused for ``wait_s`` in a row,
  or asking for more than its share (no wait admits it), is handed to the scheduler to end with an error.
* **Lent blocks come back** when requests wait and the free blocks fall below ``reserve_blocks``: the newest running
  request that holds some gives them back, its reservation raised first for the chunks that go to host memory
  (``take``), so vLLM admits new requests as it would without cold chunks.

A request's reservation is the largest its host chunks have needed, so swaps between the tiers never take it past
what was reserved; it ends when the request finishes or is preempted. The worker's pinned memory is the engine's
first host memory: the ledger holds the engine's pinned bytes (its workers) and its pageable bytes (this), the
reservations beyond the pinned bytes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class AdmissionConfig:
    chunk_tokens: int
    pool_chunks: int
    block_size: int
    chunk_bytes: int  # one chunk of every pooled layer, K and V, every rank of the engine
    request_bytes: int  # the most host memory one request may reserve (its share of the budget)
    reserve_blocks: int = 0  # free KV blocks never lent to cold chunks
    gpu_cold: bool = True  # cold chunks in free KV blocks first
    wait_s: float = 300.0  # the longest a request waits for host memory before it ends with an error

    def chunks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.chunk_tokens)

    def cold_chunks(self, blocks: int) -> int:
        """Cold positions in a row of ``blocks`` blocks (the worker's ``store.capacity()`` less the pool's)."""
        return max(0, blocks * self.block_size // self.chunk_tokens - self.pool_chunks)

    def host_chunks(self, num_tokens: int, blocks: int) -> int:
        """Chunks of a request of ``num_tokens`` that live in host memory with a row of ``blocks`` blocks."""
        return max(0, self.chunks_for(num_tokens) - self.pool_chunks - self.cold_chunks(blocks))

    def host_bytes(self, num_tokens: int, blocks: int) -> int:
        return self.host_chunks(num_tokens, blocks) * self.chunk_bytes

    def cold_blocks_wanted(self, num_tokens: int, blocks: int) -> int:
        """Blocks beyond ``blocks`` that would hold every cold chunk of ``num_tokens`` tokens."""
        cold = self.chunks_for(num_tokens) - self.pool_chunks
        if cold <= 0 or not self.gpu_cold:
            return 0
        return max(0, -(-(self.pool_chunks + cold) * self.chunk_tokens // self.block_size) - blocks)

    def share(self, family: int = 1) -> int:
        """One request's share of host memory: ``request_bytes``, split evenly between the ``family`` children of a
        request for ``n`` samples (vLLM runs each as a request of its own)."""
        return self.request_bytes // max(1, family)

    def max_tokens(self, lookahead: int = 0, family: int = 1) -> int:
        """The longest request whose host chunks fit its share with no cold block (lookahead tokens written beyond)."""
        chunks = self.pool_chunks + self.share(family) // max(1, self.chunk_bytes)
        return max(0, chunks * self.chunk_tokens - lookahead)


@dataclass
class HostAdmission:
    """One engine's reservations of host memory for paged-out KV; ``ledger`` (a ``HostLedger``) bounds the host's.
    Without a ledger there is no budget (reservations are only counted).

    Its cost does not grow with the requests that page nothing: a request's ``hold``, ``commit`` and ``release`` are
    O(1), the sum of the reservations is kept as they change, and the ledger (a file lock and a pass over its slots)
    is touched at most once a step. The engine's ledger slot holds a **claim**: the reservations beyond the pinned
    bytes, and at a step's first hold beyond it a margin of one request's share (or what the budget leaves), so that
    the holds after it in the step need no ledger; the claim settles back to the reservations at the end of the next
    step that did not touch the ledger, and at once when the engine has no reservation left. The host's budget holds
    exactly: everything granted is inside the claim."""

    config: AdmissionConfig
    ledger: object | None = None
    engine: int = 0  # the engine's tag in the ledger (``host_ledger.engine_tag``)
    pinned: int = 0  # the engine's workers' pinned bytes: reservations use them first
    reserved: dict[str, int] = field(default_factory=dict)  # request -> bytes (the most it has needed)
    pending: dict[str, int] = field(default_factory=dict)  # request -> bytes asked for this step, not yet committed
    held_back: set[str] = field(default_factory=set)  # requests refused this step (waiting, or running and preempted)
    last_held_back: set[str] = field(default_factory=set)  # those of the latest step ended
    room: dict[str, int] = field(default_factory=dict)  # request -> tokens its pool makes room for this step (scheduler)
    shares: dict[str, int] = field(default_factory=dict)  # request -> its share, where not request_bytes (n > 1)
    waiting_since: dict[str, float] = field(default_factory=dict)  # request -> when its refusals in a row began
    beyond_share: set[str] = field(default_factory=set)  # requests refused more than their share: no wait admits them
    expired: int = 0  # requests ended for waiting too long or beyond their share, summed
    refusals: int = 0  # requests refused, once a step each, summed over steps
    returned_blocks: int = 0  # KV blocks lent for cold chunks taken back for waiting requests, summed
    unbudgeted: int = 0  # total with no ledger
    claimed: int = 0  # the bytes this engine's pageable slot holds in the ledger
    ledger_touches: int = 0  # changes of the ledger, for tests and benchmarks
    _total: int = 0  # the sum over requests of max(reserved, pending)
    _touched: bool = False  # the ledger was changed in this step

    def total(self) -> int:
        return self._total

    def _need(self, req_id: str) -> int:
        return max(self.reserved.get(req_id, 0), self.pending.get(req_id, 0))

    def hold(self, req_id: str, nbytes: int) -> bool:
        """Reserve ``nbytes`` for ``req_id`` for this step (until ``commit`` or ``end_step``); False (and the request
        counted as held back) when the share or the host budget has no room."""
        current = self._need(req_id)
        if nbytes <= current:
            return True
        share = self.share_of(req_id)
        if nbytes > share or not self._fits(self._total + nbytes - current):
            self.refusals += req_id not in self.held_back
            self.held_back.add(req_id)
            if nbytes > share:
                self.beyond_share.add(req_id)
            return False
        self.pending[req_id] = nbytes
        self._total += nbytes - current
        self.held_back.discard(req_id)
        self.waiting_since.pop(req_id, None)
        return True

    def take(self, req_id: str, nbytes: int, blocks: int) -> bool:
        """Reserve ``nbytes`` for a running request now, outside any step's holds, as ``blocks`` KV blocks lent to it
        go back and their chunks to host memory (``scheduler.py``); False, with nothing counted, when its share or the
        budget has no room."""
        before = self._need(req_id)
        if nbytes > before and (nbytes > self.share_of(req_id) or not self._fits(self._total + nbytes - before)):
            return False
        self.reserved[req_id] = max(self.reserved.get(req_id, 0), nbytes)
        self._total += self._need(req_id) - before
        self.returned_blocks += blocks
        return True

    def share_of(self, req_id: str) -> int:
        return self.shares.get(req_id, self.config.request_bytes)

    def join(self, req_id: str, family: int) -> None:
        """A new request, one of ``family`` children of a request for ``n`` samples: they split one share."""
        if family > 1:
            self.shares[req_id] = self.config.share(family)

    def keep_shares(self, live) -> None:
        """Forget the shares of requests no longer in ``live`` (the scheduler's requests): a share outlives its
        request's preemptions, which release its reservation."""
        for req_id in [r for r in self.shares if r not in live]:
            del self.shares[req_id]

    def commit(self, req_id: str, nbytes: int) -> None:
        """The step was allocated with ``nbytes`` of host chunks (at most what ``hold`` reserved)."""
        if req_id not in self.pending and nbytes <= self.reserved.get(req_id, -1):
            return  # nothing changes (a request that pages nothing, or no more than before)
        before = self._need(req_id)
        self.reserved[req_id] = max(self.reserved.get(req_id, 0), nbytes)
        self.pending.pop(req_id, None)
        self._total += self.reserved[req_id] - before
        if self._total - self.pinned > self.claimed:  # more than held: never by the KVFlash manager's calls
            self._fits(self._total)

    def release(self, req_id: str) -> None:
        """A finished or preempted request: its reservation returns (to the ledger when the claim settles)."""
        self._total -= self._need(req_id)
        self.reserved.pop(req_id, None)
        self.pending.pop(req_id, None)
        self.waiting_since.pop(req_id, None)
        self.beyond_share.discard(req_id)
        if self.ledger is None:
            self.unbudgeted = self.pageable()

    def tokens_for(self, req_id: str, num_tokens: int) -> int:
        """The tokens a step to ``num_tokens`` reserves host memory for: at a decision position the worker pages out
        room for every token up to the next one (``decisions.py``), which the scheduler noted in ``room``."""
        return max(num_tokens, self.room.get(req_id, 0))

    def waiting_besides(self, req_id: str) -> bool:
        """Whether a request other than ``req_id`` was refused host memory in the latest step."""
        return bool(self.last_held_back - {req_id})

    def end_step(self, now: float | None = None) -> int:
        """After the scheduler's step (at ``now``, ``time.monotonic`` by default): reservations that were not
        allocated return, the claim settles unless the step touched the ledger, and the requests refused start their
        wait; returns the number of requests held back in it."""
        now = time.monotonic() if now is None else now
        for req_id in self.held_back:
            self.waiting_since.setdefault(req_id, now)
        for req_id, asked in self.pending.items():
            self._total -= max(0, asked - self.reserved.get(req_id, 0))
        self.pending.clear()
        self.room.clear()
        if not self._touched:
            self.settle()
        self._touched = False
        held, self.last_held_back = len(self.held_back), set(self.held_back)
        self.held_back.clear()
        return held

    def take_expired(self, now: float) -> list[tuple[str, str]]:
        """Requests of the latest step to end with an error, with why: ``"share"`` (refused more than their share)
        or ``"wait"`` (refused for ``wait_s`` in a row). They are counted and forgotten here; the scheduler ends them,
        which releases them."""
        out = [(r, "share" if r in self.beyond_share else "wait") for r in sorted(self.last_held_back)
               if r in self.beyond_share or now - self.waiting_since.get(r, now) >= self.config.wait_s]
        for req_id, _ in out:
            self.waiting_since.pop(req_id, None)
            self.beyond_share.discard(req_id)
        self.expired += len(out)
        return out

    def end_beyond_share(self, req_id: str) -> list[tuple[str, str]]:
        """A request whose prompt alone needs more than its share (no wait admits it), to end at once: counted."""
        self.expired += 1
        return [(req_id, "share")]

    def settle(self) -> None:
        """The claim back to the reservations beyond the pinned bytes (a ledger change only when they differ)."""
        if self.ledger is None:
            self.unbudgeted = self.pageable()
        elif self.claimed != self.pageable():
            self.claimed = self.ledger.hold_up_to("pageable", self.pageable(), self.engine)
            self.ledger_touches += 1

    def pageable(self) -> int:
        """Host bytes the engine's reservations take beyond its pinned memory."""
        return max(0, self._total - self.pinned)

    def _fits(self, total: int) -> bool:
        """Whether reservations of ``total`` bytes fit the claim, raised once a step by a margin of one share."""
        wanted = max(0, total - self.pinned)
        if self.ledger is None:
            self.unbudgeted = wanted
            return True
        if wanted <= self.claimed:
            return True
        if self._touched:
            return False
        self.claimed = self.ledger.hold_up_to("pageable", wanted + self.config.request_bytes, self.engine)
        self.ledger_touches += 1
        self._touched = True
        return wanted <= self.claimed
