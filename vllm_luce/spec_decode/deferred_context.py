"""Drafter context writes held back across plain steps and replayed in one pass (pure: torch only).

A DFlash drafter reads, when it drafts, the K/V that its context pass wrote for every committed
token. On a plain step (the gate chose K = 0) nothing reads that cache, so the pass can wait: the
step's target features, positions and cache slots are kept, and the next drafting step (or a full
store) writes them all in one pass before its own. Profiled on CPU (trained Qwen3.6 pair, batch 1),
the per-step pass cost 0.6 ms of a 5.4 ms plain step.

Replaying the writes in order leaves the cache as the per-step passes would have: a slot written
twice (a rejected draft's position rewritten by the next step) keeps its last write. A held write
whose block is no longer in a live request's block table is dropped (its slot becomes vLLM's padding
slot): its request finished or was preempted, and the block may now be another KV cache group's.
On hybrid targets vLLM lays the groups over the same memory (block ``b`` of the drafter's layers is
block ``b`` of some Gated DeltaNet layers' state), so such a write would corrupt a new request's
recurrent state: measured on the trained Qwen3.6 pair, 1-3 of 48 greedy outputs changed at the first
tokens after their prompt.

Two stores: ``DeferredContext`` copies each step into buffers (a GPU runner's CUDA-graph outputs are
reused by the next step); ``DeferredContextByReference`` keeps a CPU step's own feature tensors.
"""

from __future__ import annotations

from array import array

import torch

DEFAULT_MAX_BYTES = 64 << 20  # feature bytes held at most, on the device
HOST_MAX_BYTES = 256 << 20  # feature bytes the store by reference holds at most, in host memory
COMPACT_AT_MOST = 0.5  # share of a full store by reference that its kept rows may fill to stay held (``make_room``)


PADDING_SLOT = -1  # vLLM's padding slot: its cache-write kernels skip it (CUDA's and CPU's alike)


def in_live_blocks(slots: torch.Tensor, block_table: torch.Tensor, block_size: int) -> torch.Tensor:
    """Mask of ``slots`` whose block is in ``block_table`` (live requests' rows; block 0 is vLLM's null
    block, never a request's). A binary search in the sorted table: no host sync, unlike ``torch.isin``
    (its sorting path) or boolean indexing."""
    blocks = slots // block_size
    live = torch.sort(block_table.flatten().to(blocks.dtype))[0]
    if live.numel() == 0:
        return torch.zeros_like(blocks, dtype=torch.bool)
    at = torch.searchsorted(live, blocks).clamp_(max=live.numel() - 1)
    return (live[at] == blocks) & (blocks > 0)


def last_writes(slots: torch.Tensor) -> torch.Tensor:
    """Mask of the rows of ``slots`` that are the last write to their slot. A stable sort keeps each
    slot's writes in order, so the last of a run of equal slots is the latest: no host sync."""
    ordered, order = torch.sort(slots, stable=True)
    last = torch.ones_like(slots, dtype=torch.bool)
    last[:-1] = ordered[1:] != ordered[:-1]
    mask = torch.empty_like(last)
    mask[order] = last
    return mask


def writes_to_keep(slots: torch.Tensor, block_table: torch.Tensor, block_size: int) -> torch.Tensor:
    """Mask of the writes to keep: to a block in ``block_table``, and not overridden by a later write to
    its slot."""
    return in_live_blocks(slots, block_table, block_size) & last_writes(slots)


def live_last_writes(slots: torch.Tensor, block_table: torch.Tensor, block_size: int) -> torch.Tensor:
    """``slots`` with ``PADDING_SLOT`` for each write to drop (``writes_to_keep``)."""
    return torch.where(writes_to_keep(slots, block_table, block_size), slots, PADDING_SLOT)


POWER_OF_TWO_ROWS = 4096  # up to here a context pass's rows are padded to a power of two, beyond to eighths


def padded_rows(n: int) -> int:
    """``n`` rounded up to a power of two up to ``POWER_OF_TWO_ROWS``, beyond that to one of eight sizes per power
    of two (at most 1/8 more rows). On CPU the drafter's ``fc`` took 0.6-2.7 ms at a row count it had not seen and
    0.15-0.5 ms after, up to 4,096 rows (the predictable pair's drafter, 2-core CPU); at eight sizes per octave, held
    contexts of 500-900 rows met a new count at most takes, and a power of two costs less than that in extra rows."""
    if n <= POWER_OF_TWO_ROWS:
        return 1 << max(0, n - 1).bit_length()
    step = 1 << (n.bit_length() - 4)
    return -(-n // step) * step


def pad_rows(features: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Context writes padded to ``padded_rows`` rows: zero features at position 0 to ``PADDING_SLOT``, which the
    cache write skips. On CPU, oneDNN builds a GEMM kernel for each new row count: each of a context pass's two
    GEMMs took about 0.5 ms more for a row count not seen before (the predictable pair's drafter, 2-core CPU;
    90 against 835 us for ``fc`` at 128 rows), and a held context has a new count at nearly every take."""
    pad = padded_rows(features.shape[0]) - features.shape[0]
    if not pad:
        return features, positions, slots
    return (torch.nn.functional.pad(features, (0, 0, 0, pad)), torch.nn.functional.pad(positions, (0, pad)),
            torch.nn.functional.pad(slots, (0, pad), value=PADDING_SLOT))


def int64_tensor(values: list[int], device) -> torch.Tensor:
    """A list of ints as an int64 tensor, through an ``array``: 3.5x faster than ``torch.tensor`` of the list (0.5
    against 1.8 ms for 32,768 values on the development CPU). A hold extends lists: 0.4 us for 64 values, where
    extending an array took 2.5 us."""
    return torch.frombuffer(array("q", values), dtype=torch.long).to(device)


def _parts(features) -> tuple[torch.Tensor, ...]:
    return tuple(features) if isinstance(features, (list, tuple)) else (features,)


def _checked_parts(features, positions, slots) -> tuple[torch.Tensor, ...]:
    parts = _parts(features)
    n = parts[0].shape[0]
    if not (all(p.shape[0] == n for p in parts) and positions.shape[0] == n == slots.shape[0]):
        raise ValueError(f"one row per token: features {[tuple(p.shape) for p in parts]}, positions "
                         f"{tuple(positions.shape)}, slots {tuple(slots.shape)}")
    return parts


class DeferredContext:
    """The context writes of plain steps not yet in the drafter's cache, oldest first, in buffers kept
    from the first hold on (as large as the limits allow). A hold copies one step's rows in, the target
    layers' outputs concatenated straight into place (one copy where a concatenation and a clone were
    two, and no allocation); a take reads them back without concatenating the held steps."""

    holds_large_steps = False  # a large step's copy costs more than its own pass saves (see the proposer)

    def __init__(self, max_tokens: int, max_bytes: int = DEFAULT_MAX_BYTES):
        if max_tokens < 1 or max_bytes < 1:
            raise ValueError(f"DeferredContext needs max_tokens and max_bytes >= 1, got {max_tokens}, {max_bytes}")
        self.max_tokens, self.max_bytes = max_tokens, max_bytes
        self._buffers: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # features, positions, slots
        self._kind: tuple | None = None  # width, dtype, device of the features held
        self._rows = 0  # rows of that kind the limits allow
        self.steps = 0
        self.tokens = 0

    def __len__(self) -> int:
        return self.steps

    def capacity(self, features) -> int:
        """Rows of ``features``' width and type (one tensor, or parts) that both limits allow: the
        buffers' size."""
        parts = _parts(features)
        return min(self.max_tokens, self.max_bytes // (sum(p.shape[-1] for p in parts) * parts[0].element_size()))

    def _admits(self, parts) -> bool:
        """Whether these parts, after what is held, stay within the limits. A new kind of features (width,
        type, device) is taken on when nothing is held; while something is, it is an error."""
        first = parts[0]
        kind = (sum(p.shape[-1] for p in parts), first.dtype, first.device)
        if kind != self._kind:
            if self.tokens:
                raise ValueError(f"held features are {self._kind[0]} wide, {self._kind[1]}; these are {kind[0]} "
                                 f"wide, {kind[1]}")
            self._kind, self._rows, self._buffers = kind, self.capacity(parts), None
        return self.tokens + first.shape[0] <= self._rows

    def hold(self, features, positions: torch.Tensor, slots: torch.Tensor) -> bool:
        """Keep one step's writes (copied: the caller's buffers are reused by the next step), or nothing and
        False if they would exceed the limits. ``features`` is one tensor, or parts concatenated on the last
        dimension (the target layers' outputs)."""
        parts = _checked_parts(features, positions, slots)
        if not self._admits(parts):
            return False
        if self._buffers is None:
            index = dict(dtype=torch.long, device=parts[0].device)  # positions and slots, whatever their type
            self._buffers = (parts[0].new_empty(self._rows, self._kind[0]), torch.empty(self._rows, **index),
                             torch.empty(self._rows, **index))
        feats, pos, slot = self._buffers
        lo, hi = self.tokens, self.tokens + parts[0].shape[0]
        if len(parts) == 1:
            feats[lo:hi].copy_(parts[0])
        else:
            torch.cat(parts, dim=-1, out=feats[lo:hi])
        pos[lo:hi].copy_(positions)
        slot[lo:hi].copy_(slots)
        self.steps += 1
        self.tokens = hi
        return True

    def take(self, block_table: torch.Tensor, block_size: int
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """The held writes as one batch, in order, None if there is none. A write whose block is not in
        ``block_table`` (the live requests' rows of the drafter's KV cache group), or that a later write
        to its slot overrides, gets ``PADDING_SLOT``: the cache write skips it, so each live slot keeps
        its last write. Marked, not removed: removing rows needs their count on the host (a sync); on an
        H100 a take of about 1,600 writes went from 0.52-0.94 to 0.34-0.63 ms (``docs/benchmarks.md``).
        Empties the store; the features and positions returned are its buffers, valid until the next hold."""
        if not self.tokens:
            return None
        features, positions, slots = (b[: self.tokens] for b in self._buffers)
        self.clear()
        return features, positions, live_last_writes(slots, block_table, block_size)

    def make_room(self, block_table: torch.Tensor, block_size: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """Room for more holds: the held writes to make now (``take``), or None where the store made room without
        them (``DeferredContextByReference.make_room``; not here, where counting the writes to keep would wait
        for the device)."""
        return self.take(block_table, block_size)

    def clear(self) -> None:
        self.steps = self.tokens = 0


class DeferredContextByReference(DeferredContext):
    """The store for steps whose target features are new tensors that nothing writes after the step, as on
    CPU, where vLLM runs no CUDA graphs (on a GPU a captured graph's outputs are its fixed buffers, reused
    by the next step): a hold keeps the features themselves, and positions and slots as Python lists (the
    runner's buffers are reused). No torch call in a hold; measured on a 2-core CPU between model
    forwards, a torch call costs 10-15 us there, and copying into buffers held 36-67 us a step against
    12-14. A take concatenates the held steps: one call per target layer and one across them.

    Holding copies nothing, so steps of any size are held (prompts included), up to ``max_bytes`` of
    features (in host memory) and ``max_tokens`` rows, and a take removes the writes to drop instead of
    marking them: on the host, counting them needs no device sync. A request that finishes while the
    gate runs plain then never costs a drafter context pass: measured at batch 64 on a 2-core CPU, those
    passes (the prompts' and each full store's) averaged 1.0 ms of a 15 ms plain step. A take
    concatenates only the steps with a write to keep, and joins the target layers' rows after removing
    the others: a full store at batch 64 (32,768 rows, half of them finished requests') took 31 ms
    when every step was concatenated and the dropped rows removed after. A full store makes room (``make_room``):
    where at most half of its rows are live, it keeps those and drops the rest, with no pass."""

    holds_large_steps = True

    def __init__(self, max_tokens: int = 1 << 62, max_bytes: int = HOST_MAX_BYTES):
        super().__init__(max_tokens, max_bytes)
        self._held: list[tuple[torch.Tensor, ...]] = []
        self._positions: list[int] = []
        self._slots: list[int] = []
        self._ends: list[int] = []  # each held step's end row

    def hold(self, features, positions: torch.Tensor, slots: torch.Tensor) -> bool:
        parts = _checked_parts(features, positions, slots)
        if not self._admits(parts):
            return False
        self._held.append(parts)
        self._positions += positions.tolist()
        self._slots += slots.tolist()
        self.steps += 1
        self.tokens += parts[0].shape[0]
        self._ends.append(self.tokens)
        return True

    def take(self, block_table: torch.Tensor, block_size: int
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        kept = self._kept(block_table, block_size) if self.tokens else None
        self.clear()
        return None if kept is None else self._batch(*kept)

    def make_room(self, block_table: torch.Tensor, block_size: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """Drop the writes a take would drop and keep the others held, if they fill at most half the store
        (``COMPACT_AT_MOST``; None: room made without a pass); otherwise take them all. Where requests finish
        before anything drafts (a regime that runs plain), their rows then never cost a pass: at batch 64 on the
        always-wrong pair (2-core CPU) a full store's take wrote 28-50 ms of live rows about once a pass of 192
        tokens, 1.7% of the time. Steps whose rows are all kept stay as they are (a batch that finishes together
        leaves whole steps); where some steps keep only part of theirs, the kept rows are copied into one step."""
        kept = self._kept(block_table, block_size) if self.tokens else None
        self.clear()
        if kept is None:
            return None
        held, rows, positions, slots = kept
        if positions.numel() > self._rows * COMPACT_AT_MOST:
            return self._batch(*kept)
        if rows is not None:  # some steps keep part of their rows: those rows, copied into one step
            held = [tuple(self._joined(held, rows))]
        self._held, self._positions, self._slots = held, positions.tolist(), slots.tolist()
        for parts in held:
            self.tokens += parts[0].shape[0]
            self._ends.append(self.tokens)
        self.steps = len(held)
        return None

    def _kept(self, block_table: torch.Tensor, block_size: int):
        """The held writes to keep (``writes_to_keep``): the held steps that have one, the kept rows in those steps'
        concatenation (None: all of them), and the kept writes' positions and slots. None when no write is kept."""
        held, ends, device = self._held, self._ends, self._kind[2]
        index = dict(dtype=torch.long, device=device)
        slots = int64_tensor(self._slots, device)
        keep = writes_to_keep(slots, block_table, block_size)
        ends = torch.tensor(ends, **index)
        kept_by_end = keep.cumsum(0)[ends - 1]  # writes kept up to each step's end
        kept = int(kept_by_end[-1])
        if not kept:
            return None
        positions = int64_tensor(self._positions, device)
        rows = None  # the kept rows, in the concatenation of the steps that have one; None: all of them
        if kept < keep.numel():
            rows = keep.nonzero().squeeze(1)
            positions, slots = positions[rows], slots[rows]
            live = torch.diff(kept_by_end, prepend=kept_by_end.new_zeros(1)) > 0  # steps with a write to keep
            alive = live.tolist()
            if not all(alive):  # only those steps' rows: each kept row moves up by the dropped steps' rows before it
                dropped = torch.diff(ends, prepend=ends.new_zeros(1)) * ~live
                dropped_through = dropped.cumsum(0)  # dropped steps' rows up to and including each step
                held = [parts for parts, a in zip(held, alive) if a]
                # Every row of the steps kept (the finished requests' steps dropped whole): no gather.
                rows = None if kept + int(dropped_through[-1]) == keep.numel() else (
                    rows - (dropped_through - dropped)[torch.searchsorted(ends, rows, right=True)])
        return held, rows, positions, slots

    def _batch(self, held, rows, positions, slots) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        layers = self._joined(held, rows)
        return (layers[0] if len(layers) == 1 else torch.cat(layers, dim=-1)), positions, slots

    @staticmethod
    def _joined(held, rows) -> list[torch.Tensor]:
        """The held steps' ``rows`` (None: all), as one tensor per target layer where every step holds the same
        parts (the runner's), else as one tensor of the parts concatenated."""
        if len({tuple(p.shape[-1] for p in parts) for parts in held}) == 1:  # alike parts (the runner's)
            layers = [torch.cat(layer) for layer in zip(*held)]  # each target layer's rows, held steps
            return layers if rows is None else [layer.index_select(0, rows) for layer in layers]
        features = torch.cat([torch.cat(parts, dim=-1) for parts in held])
        return [features if rows is None else features.index_select(0, rows)]

    def clear(self) -> None:
        super().clear()
        self._held, self._positions, self._slots, self._ends = [], [], [], []
