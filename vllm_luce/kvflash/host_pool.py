"""Pinned host memory for paged-out chunks, pinned in slabs and kept (pure torch; no vLLM import).

Through vLLM on an H200, paging each chunk out to a fresh pinned tensor cost about 1 s per GB paged:
pinning is slow (the driver locks every page) and the caching host allocator rounds a 9.4 MB chunk of
the 8B shape up to 16 MB. KVFlash's time to first token at 128K was 30 s against vLLM's 11 s, with
18.7 GB paged out. The pool pins slabs of many chunks, hands out one chunk's view at a time, takes a view
back when its last reference goes (a page-in, a finished request) and keeps the slab for later requests,
so paging costs the copy alone once the pool has grown. A background thread pins the next slab while
fewer than half a slab's chunks are free, ahead of the prefill that will page them out.

A page-out never waits for pinning. At 7faffaa on an H200 KVFlash's time to first token exceeded vLLM alone's by
0.58 s at 8K, 1.8 s at 32K and 5.2 s at 128K while the pool pinned 0.8, 4.0 and 14.5 GB during those prefills:
the prefill paged out faster than slabs could be pinned, and each page-out that found no free view pinned a slab
on the spot. With a background thread (the default) ``take`` now returns None instead, and the caller copies that
chunk to pageable memory (a synchronous copy of about a millisecond per 9.4 MB chunk) while the slab is pinned
behind it.

``luce.kvflash.host_pinned_bytes`` pins slabs at startup (``reserve``), for servers whose paged-out KV would
otherwise be pinned while they serve.

A view returned to the pool may still be the source or target of a copy on the copy stream; it is handed
out again only once an event recorded on that stream at its return has completed.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque

import torch

SLAB_BYTES = 256 << 20


class PinnedChunkPool:
    def __init__(self, chunk_shape: tuple[int, ...], dtype: torch.dtype, copy_stream=None,
                 slab_bytes: int = SLAB_BYTES, pin: bool = True, background: bool = True):
        self.chunk_shape, self.dtype, self.copy_stream, self.pin = tuple(chunk_shape), dtype, copy_stream, pin
        chunk_bytes = max(1, torch.Size(chunk_shape).numel() * torch.empty(0, dtype=dtype).element_size())
        self.slab_chunks = max(1, slab_bytes // chunk_bytes)
        self.slabs: list[torch.Tensor] = []
        self.free: list[tuple[int, int]] = []  # (slab, index)
        self.returned: deque = deque()  # (slot, event or None): back from use, maybe still in a copy
        self.lock = threading.RLock()  # a finalizer may give a view back while this thread holds it
        self.background = background
        self._growing = False
        self.grown_in_background = 0
        self.grown_on_demand = 0
        self.misses = 0  # takes that found no free view while the background thread pinned

    @property
    def pinned_bytes(self) -> int:
        return sum(s.numel() * s.element_size() for s in self.slabs)

    def take(self) -> torch.Tensor | None:
        """A chunk-shaped host tensor, pinned where ``pin``; it returns to the pool when no longer referenced. None
        when no view is free and a background thread pins the next slab (without one, a slab is pinned now)."""
        with self.lock:
            self._reclaim()
            if not self.free and self.background:
                self.misses += 1
                slab = None
            else:
                if not self.free:
                    self._add_slab(self._new_slab())
                    self.grown_on_demand += 1
                slab, index = self.free.pop()
            low = len(self.free) < self.slab_chunks // 2
        if low and self.background:
            self._grow_in_background()
        if slab is None:
            return None
        view = self.slabs[slab][index]
        weakref.finalize(view, self._give_back, (slab, index))
        return view

    def reserve(self, nbytes: int) -> None:
        """Pin slabs now, on this thread, until the pool holds ``nbytes`` (the server's startup, before any
        request: ``luce.kvflash.host_pinned_bytes``)."""
        while self.pinned_bytes < nbytes:
            slab = self._new_slab()
            with self.lock:
                self._add_slab(slab)

    def _new_slab(self) -> torch.Tensor:
        return torch.empty((self.slab_chunks, *self.chunk_shape), dtype=self.dtype, pin_memory=self.pin)

    def _add_slab(self, slab: torch.Tensor) -> None:
        self.slabs.append(slab)
        self.free.extend((len(self.slabs) - 1, i) for i in reversed(range(self.slab_chunks)))

    def _grow_in_background(self) -> None:
        with self.lock:
            if self._growing:
                return
            self._growing = True

        def grow():
            try:
                slab = self._new_slab()
                with self.lock:
                    self._add_slab(slab)
                    self.grown_in_background += 1
            finally:
                self._growing = False

        threading.Thread(target=grow, name="luce-kvflash-pin", daemon=True).start()

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
