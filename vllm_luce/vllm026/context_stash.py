"""vLLM 0.26: the drafter's context inputs of plain steps, held on the device and written in one pass later (no vLLM
import; bound to Model Runner V2 by ``context_stash_v2.py``).

On a plain step DFlash writes the drafter's context K/V for the step's tokens from the target's features, so
that the drafter's cache is complete when speculation resumes: on Model Runner V2 that is the fc projection of the
concatenated auxiliary hidden states and every drafter layer's K/V projection, norm, RoPE and cache write, a
weight read of about 250 MB at Qwen3-8B-DFlash's shape and about 16 kernels, for one token per request. Nothing
reads that cache until the next drafter forward, so the stash keeps each plain step's features, positions and
cache slots (three copies) and hands them back for one context pass over all of them: before the next drafter
forward, before blocks can change hands (a request finished, preempted or new), or when it is full. The cache
then holds what writing every step would have put there.
"""

from __future__ import annotations

import torch


class ContextStash:
    """Up to ``capacity`` tokens of features ``[tokens, F]``, positions ``[tokens]`` and cache slots (one tensor
    ``[tokens]``, or a list with one per drafter layer). ``stage`` copies a step's features (padded rows
    included), ``commit`` keeps the first ``len(positions)`` of them with their positions and slots, ``drain``
    returns everything kept, in step order, and empties the stash."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"a context stash holds at least one token, got {capacity}")
        self.capacity = capacity
        self.features: torch.Tensor | None = None
        self.positions: torch.Tensor | None = None
        self.slots: torch.Tensor | None = None  # [slot lists, capacity]
        self.per_layer: bool | None = None  # whether slots came as a list (one per drafter layer)
        self.used = 0  # tokens kept
        self.staged = 0  # rows staged after them, awaiting commit

    def stage(self, features: torch.Tensor) -> bool:
        """Copy a step's features after the kept ones; False (nothing copied) when they do not fit."""
        rows = features.shape[0]
        if features.dim() != 2 or self.used + rows > self.capacity:
            return False
        if self.features is None or self.features.shape[1] != features.shape[1] \
                or self.features.dtype != features.dtype or self.features.device != features.device:
            if self.used:
                return False  # another shape while tokens are kept: the caller writes them first
            self.features = torch.empty(self.capacity, features.shape[1], dtype=features.dtype,
                                        device=features.device)
        self.features[self.used:self.used + rows].copy_(features)
        self.staged = rows
        return True

    def staged_features(self) -> torch.Tensor:
        return self.features[self.used:self.used + self.staged]

    def unstage(self) -> None:
        self.staged = 0

    def commit(self, positions: torch.Tensor, slots: torch.Tensor | list[torch.Tensor]) -> None:
        tokens = positions.shape[0]
        if tokens > self.staged:
            raise ValueError(f"commit of {tokens} tokens after {self.staged} staged rows")
        per_layer = isinstance(slots, (list, tuple))
        rows = list(slots) if per_layer else [slots]
        if self.used and (per_layer != self.per_layer or len(rows) != self.slots.shape[0]):
            raise ValueError("the drafter's cache slots changed form while tokens were kept")
        if self.positions is None or self.slots.shape[0] != len(rows) or self.positions.device != positions.device:
            self.positions = torch.empty(self.capacity, dtype=positions.dtype, device=positions.device)
            self.slots = torch.empty(len(rows), self.capacity, dtype=rows[0].dtype, device=rows[0].device)
        self.per_layer = per_layer
        end = self.used + tokens
        self.positions[self.used:end].copy_(positions)
        for i, row in enumerate(rows):
            self.slots[i, self.used:end].copy_(row)
        self.used, self.staged = end, 0

    def drain(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | list[torch.Tensor]] | None:
        """The kept tokens' features, positions and slots (in the form they came), or None when empty. The views
        stay valid until the next ``stage``."""
        if not self.used:
            return None
        used, self.used, self.staged = self.used, 0, 0
        slots = self.slots[:, :used]
        return (self.features[:used], self.positions[:used],
                list(slots.unbind(0)) if self.per_layer else slots[0])
