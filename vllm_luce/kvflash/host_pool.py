"""Host memory pinned at startup for paged-out chunks, in slabs handed out one chunk at a time (pure torch; no
vLLM import).

A page-out copies to pinned memory asynchronously, on the copy stream; to pageable memory the copy is synchronous
and stalls the engine too, and is many times slower (``benchmarks/kvflash_scoring.py``; docs/benchmarks.md, "KVFlash
salient scoring and reselection cost (GPU)"). Pinning itself is the expensive part, and it must not happen while
the server serves: pinning slabs in a background thread during prefills stalled the engine, delaying first tokens,
reselections and queued prompts well past vLLM alone's (docs/benchmarks.md, "Measurements behind design choices
in the code").

So the pool pins ``reserve(nbytes)`` at startup (``luce.kvflash.host_pinned_bytes``) and never grows: ``take``
returns None once every view is in use, and the caller copies that chunk to pageable memory. A view comes back
when its last reference goes (a page-in, a finished request) and is handed out again only once an event recorded
on the copy stream at its return has completed.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque

import torch

SLAB_BYTES = 256 << 20


class PinnedChunkPool:
    def __init__(self, chunk_shape: tuple[int, ...], dtype: torch.dtype, copy_stream=None,
                 slab_bytes: int = SLAB_BYTES, pin: bool = True):
        self.chunk_shape, self.dtype, self.copy_stream, self.pin = tuple(chunk_shape), dtype, copy_stream, pin
        chunk_bytes = max(1, torch.Size(chunk_shape).numel() * torch.empty(0, dtype=dtype).element_size())
        self.slab_chunks = max(1, slab_bytes // chunk_bytes)
        self.slabs: list[torch.Tensor] = []
        self.free: list[tuple[int, int]] = []  # (slab, index)
        self.returned: deque = deque()  # (slot, event or None): back from use, maybe still in a copy
        self.lock = threading.RLock()  # a finalizer may give a view back while this thread holds it
        self.misses = 0  # takes that found every view in use: those chunks went to pageable memory

    @property
    def pinned_bytes(self) -> int:
        return sum(s.numel() * s.element_size() for s in self.slabs)

    def take(self) -> torch.Tensor | None:
        """A chunk-shaped host tensor of the pool (pinned where ``pin``) that returns to it when no longer
        referenced, or None when every view is in use or still in a copy."""
        with self.lock:
            self._reclaim()
            if not self.free:
                self.misses += 1
                return None
            slab, index = self.free.pop()
        view = self.slabs[slab][index]
        weakref.finalize(view, self._give_back, (slab, index))
        return view

    def reserve(self, nbytes: int) -> None:
        """Pin slabs now until the pool holds ``nbytes`` rounded up to a whole chunk (the server's startup, before any
        request)."""
        chunk_bytes = torch.Size(self.chunk_shape).numel() * torch.empty(0, dtype=self.dtype).element_size()
        while self.pinned_bytes < nbytes:
            chunks = min(self.slab_chunks, -(-(nbytes - self.pinned_bytes) // chunk_bytes))
            slab = torch.empty((chunks, *self.chunk_shape), dtype=self.dtype, pin_memory=self.pin)
            with self.lock:
                self.slabs.append(slab)
                self.free.extend((len(self.slabs) - 1, i) for i in reversed(range(chunks)))

    def record_event(self):
        """An event after every copy queued so far on the copy stream (None without one)."""
        if self.copy_stream is None:
            return None
        event = torch.cuda.Event()
        event.record(self.copy_stream)
        return event

    def _give_back(self, slot: tuple[int, int]) -> None:
        event = self.record_event()
        with self.lock:
            self.returned.append((slot, event))

    def _reclaim(self) -> None:
        """Returned slots whose copies have completed become free (in return order)."""
        while self.returned and (self.returned[0][1] is None or self.returned[0][1].query()):
            self.free.append(self.returned.popleft()[0])
