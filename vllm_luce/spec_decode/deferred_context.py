"""Drafter context writes held back across plain steps and replayed in one pass (pure: torch only).

A DFlash drafter reads, when it drafts, the K/V that its context pass wrote for every committed
token. On a plain step (the gate chose K = 0) nothing reads that cache, so the pass can wait: the
step's target features, positions and cache slots are kept, and the next drafting step (or a full
store) writes them all in one pass before its own. Profiled on CPU (trained Qwen3.6 pair, batch 1),
the per-step pass cost 0.6 ms of a 5.4 ms plain step.

Replaying the writes in order leaves the cache as the per-step passes would have: a slot written
twice (a rejected draft's position rewritten by the next step) keeps its last write. A held write
whose block is no longer in a live request's block table is dropped: its request finished or was
preempted, and the block may now be another KV cache group's. On hybrid targets vLLM lays the groups
over the same memory (block ``b`` of the drafter's layers is block ``b`` of some Gated DeltaNet
layers' state), so such a write would corrupt a new request's recurrent state: measured on the trained
Qwen3.6 pair, 1-3 of 48 greedy outputs changed at the first tokens after their prompt.
"""

from __future__ import annotations

import torch

DEFAULT_MAX_BYTES = 64 << 20  # feature bytes held at most, on the device


def in_live_blocks(slots: torch.Tensor, block_table: torch.Tensor, block_size: int) -> torch.Tensor:
    """Mask of ``slots`` whose block is in ``block_table`` (live requests' rows; block 0 is vLLM's null
    block, never a request's)."""
    live = block_table.flatten()
    return torch.isin(slots // block_size, live[live > 0])


def last_writes(slots: torch.Tensor) -> torch.Tensor:
    """Indices into ``slots`` of the last write to each distinct slot."""
    unique, inverse = torch.unique(slots, return_inverse=True)
    last = torch.full((unique.numel(),), -1, dtype=torch.long, device=slots.device)
    return last.scatter_reduce_(0, inverse, torch.arange(slots.numel(), device=slots.device), reduce="amax")


class DeferredContext:
    """The context writes of plain steps not yet in the drafter's cache, oldest first."""

    def __init__(self, max_tokens: int, max_bytes: int = DEFAULT_MAX_BYTES):
        if max_tokens < 1 or max_bytes < 1:
            raise ValueError(f"DeferredContext needs max_tokens and max_bytes >= 1, got {max_tokens}, {max_bytes}")
        self.max_tokens, self.max_bytes = max_tokens, max_bytes
        self._features: list[torch.Tensor] = []
        self._positions: list[torch.Tensor] = []
        self._slots: list[torch.Tensor] = []
        self.tokens = 0
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._features)

    def fits(self, features: torch.Tensor) -> bool:
        """Whether holding ``features`` too stays within both limits."""
        return (self.tokens + features.shape[0] <= self.max_tokens
                and self.bytes + features.numel() * features.element_size() <= self.max_bytes)

    def hold(self, features: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor) -> None:
        """Keep one step's writes (copies: the caller's buffers are reused by the next step)."""
        if not (features.shape[0] == positions.shape[0] == slots.shape[0]):
            raise ValueError(f"one row per token: features {tuple(features.shape)}, positions "
                             f"{tuple(positions.shape)}, slots {tuple(slots.shape)}")
        self._features.append(features.clone())
        self._positions.append(positions.clone())
        self._slots.append(slots.clone())
        self.tokens += features.shape[0]
        self.bytes += features.numel() * features.element_size()

    def take(self, block_table: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """The held writes whose block is still in ``block_table`` (the live requests' rows of the
        drafter's KV cache group), each slot once with its last write, as one batch; None if there is
        none. Empties the store."""
        if not self._features:
            return None
        features, positions, slots = (torch.cat(x) for x in (self._features, self._positions, self._slots))
        self.clear()
        rows = in_live_blocks(slots, block_table, block_size).nonzero().flatten()
        rows = rows[last_writes(slots[rows])]
        if rows.numel() == 0:
            return None
        if rows.numel() == slots.numel():  # every write live and to a distinct slot (their order is free)
            return features, positions, slots
        return features[rows], positions[rows], slots[rows]

    def clear(self) -> None:
        self._features, self._positions, self._slots = [], [], []
        self.tokens = self.bytes = 0
