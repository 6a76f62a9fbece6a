"""Where a pooled request's cold chunks go, and whether it may run this step (pure; no vLLM import).

The scheduler decides, per request and step, before the worker pages anything out:

* **Free KV blocks first.** A request's chunks beyond its pool go to blocks of vLLM's KV cache beyond the pool's,
  while the cache has free blocks above ``reserve_blocks`` (kept for other requests' pools and vLLM's own
  headroom): a page-out is then a copy inside the GPU, and no host memory is used. The worker puts cold chunks in
  those blocks first (``pager.py``), so both sides count the same chunks (``host_chunks``).
* **Host memory for the rest**, reserved before the step that pages it out: a request whose chunks would not fit
  the host budget (``host_ledger.py``, shared by the host) or its own share (``request_bytes``) is held back: it
  waits, as for KV blocks, or a running one is preempted by vLLM's own rules and computed again later. Nothing
  is dropped.

A request's reservation is the largest its host chunks have needed, so swaps between the tiers never take it past
what was reserved; it ends when the request finishes or is preempted. The worker's pinned memory is the engine's
first host memory: the ledger holds the engine's pinned bytes (its workers) and its pageable bytes (this), the
reservations beyond the pinned bytes.
"""

from __future__ import annotations

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

    def max_tokens(self, lookahead: int = 0) -> int:
        """The longest request whose host chunks fit its share with no cold block (lookahead tokens written beyond)."""
        chunks = self.pool_chunks + self.request_bytes // max(1, self.chunk_bytes)
        return max(0, chunks * self.chunk_tokens - lookahead)


@dataclass
class HostAdmission:
    """One engine's reservations of host memory for paged-out KV; ``ledger`` (a ``HostLedger``) bounds the host's.
    Without a ledger there is no budget (reservations are only counted)."""

    config: AdmissionConfig
    ledger: object | None = None
    engine: int = 0  # the engine's tag in the ledger (``host_ledger.engine_tag``)
    pinned: int = 0  # the engine's workers' pinned bytes: reservations use them first
    reserved: dict[str, int] = field(default_factory=dict)  # request -> bytes (the most it has needed)
    pending: dict[str, int] = field(default_factory=dict)  # request -> bytes asked for this step, not yet committed
    held_back: set[str] = field(default_factory=set)  # requests refused this step (waiting, or running and preempted)
    refusals: int = 0  # requests refused, once a step each, summed over steps
    unbudgeted: int = 0  # total with no ledger

    def total(self) -> int:
        return sum(max(self.reserved.get(r, 0), self.pending.get(r, 0)) for r in self.reserved.keys() | self.pending)

    def hold(self, req_id: str, nbytes: int) -> bool:
        """Reserve ``nbytes`` for ``req_id`` for this step (until ``commit`` or ``end_step``); False (and the request
        counted as held back) when the share or the host budget has no room."""
        if nbytes <= max(self.reserved.get(req_id, 0), self.pending.get(req_id, 0)):
            self.pending[req_id] = max(nbytes, self.pending.get(req_id, 0))
            return True
        previous = self.pending.get(req_id)
        self.pending[req_id] = nbytes
        if nbytes > self.config.request_bytes or not self._sync():
            if previous is None:
                del self.pending[req_id]
            else:
                self.pending[req_id] = previous
            self.refusals += req_id not in self.held_back
            self.held_back.add(req_id)
            return False
        self.held_back.discard(req_id)
        return True

    def commit(self, req_id: str, nbytes: int) -> None:
        """The step was allocated with ``nbytes`` of host chunks (at most what ``hold`` reserved)."""
        self.reserved[req_id] = max(self.reserved.get(req_id, 0), nbytes)
        self.pending.pop(req_id, None)
        self._sync()

    def release(self, req_id: str) -> None:
        """A finished or preempted request: its reservation returns."""
        self.reserved.pop(req_id, None)
        self.pending.pop(req_id, None)
        self._sync()

    def end_step(self) -> int:
        """After the scheduler's step: reservations that were not allocated return; the number of requests held back
        in it (a running request refused is preempted by vLLM, and counts too)."""
        if self.pending:
            self.pending.clear()
            self._sync()
        held = len(self.held_back)
        self.held_back.clear()
        return held

    def pageable(self) -> int:
        """Host bytes the engine may hold beyond its pinned memory."""
        return max(0, self.total() - self.pinned)

    def _sync(self) -> bool:
        """The ledger holds this engine's pageable bytes; False when an increase does not fit the budget."""
        if self.ledger is None:
            self.unbudgeted = self.pageable()
            return True
        return self.ledger.hold("pageable", self.pageable(), self.engine)
