"""Which head dims a KVFlash salient summary keeps and scores (pure: no Triton, so KVFlash's cores import it on any
host). ``kvflash.worker.scored_dims`` reads them off the model's RoPE; ``kernels/chunk_salient`` stores and scores
them."""

from __future__ import annotations

from typing import NamedTuple

import torch

# A head that RoPE rotates whole leaves out its two fastest-rotating pairs (about a radian a token: they carry where a
# token is, not what it says), so two int4 keys with their fp16 scales take D bytes, a quarter of an fp32 mean key.
FAST_PAIRS = 2


class ScoredDims(NamedTuple):
    """The head dims a summary keeps and scores: every ``period`` consecutive dims (0: the whole head) leave out their
    first ``skip``. RoPE rotating the first ``r`` dims: ``(r, 0)``; rotating pairs ``(i, i + D/2)`` for the first ``n``
    of each half, as Gemma 4's proportional RoPE does: ``(n, D/2)``; the default keeps every dim."""

    skip: int = 0
    period: int = 0

    def runs(self, head_dim: int) -> tuple[int, int, int]:
        """(skip, period, kept): each ``period`` dims of the head keep their last ``kept``, as the kernels take it."""
        period = self.period or head_dim
        return self.skip, period, period - self.skip

    def count(self, head_dim: int) -> int:
        _, period, kept = self.runs(head_dim)
        return head_dim // period * kept

    def index(self, head_dim: int) -> torch.Tensor:
        """The kept dims, ascending, as a long tensor."""
        _, period, _ = self.runs(head_dim)
        dims = torch.arange(head_dim)
        return dims[dims % period >= self.skip]

    def check(self, name: str, head_dim: int) -> None:
        """Whole periods that leave a dim to score, and kept runs of even length (the kernels read dims in pairs)
        wherever there is more than one run."""
        _, period, _ = self.runs(head_dim)
        if not (0 <= self.skip < period <= head_dim and head_dim % period == 0) or (
                period < head_dim and (period - self.skip) % 2):
            raise ValueError(f"{name}: scored dims {tuple(self)} do not fit a head of {head_dim}: expected skip in "
                             f"[0, period), a period dividing the head (0: the head) and, with several periods, an "
                             f"even number of dims kept in each")
