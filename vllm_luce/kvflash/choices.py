"""A paged request's chunk choices as a record two runs of the request can be compared by (pure: torch only).

KVFlash chooses which chunks stay resident at decision positions fixed by the request alone (``decisions.py``), from
scores of its queries and keys. Those are rounded as the batch's kernels round them, so two runs of one request
beside different requests can score two nearly tied chunks in either order, keep different ones, and from there read
different context. With ``luce.kvflash.log_choices`` each worker logs, when a paged request ends, one line per
request: for every decision that chose (an eviction or a reselection), its position, a digest of the resident chunks
after it and its closest call (``margin``: the gap between the last chunk chosen and the first passed over, over the
largest score's magnitude). Two runs' lines tell whether their answers parted with the same choices (then bytes,
positions or vLLM's own rounding parted them) or after a choice, and how close that choice was.
"""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass, field

import torch

LINE = re.compile(r"KVFlash chunk choices of request (\S+): (.*)$")


def _scale(scores: torch.Tensor) -> float:
    return max(float(scores.abs().max()), 1e-6) if len(scores) else 1.0


def eviction_margin(scores: torch.Tensor, count: int) -> float:
    """Evicting the ``count`` lowest of ``scores``: how far the scores at the cut are from changing sides, relative
    (inf when every candidate goes or none does: no call to make). Scores exactly equal come from one source (a
    chunk scores at least its predecessor) and move together, their order by position: where the cut falls among
    equal ones, the nearest other score on either side is what rounding could move across."""
    if count <= 0 or count >= len(scores):
        return math.inf
    ranked = torch.sort(scores.float()).values
    low, high = float(ranked[count - 1]), float(ranked[count])
    if high > low:
        return (high - low) / _scale(scores)
    above, below = ranked[ranked > low], ranked[ranked < low]
    gaps = ([float(above[0]) - low] if len(above) else []) + ([low - float(below[-1])] if len(below) else [])
    return min(gaps) / _scale(scores) if gaps else math.inf


def swap_margin(gaps: list[float], scores: torch.Tensor) -> float:
    """A reselection's closest call: the smallest score gap of the swaps it made and of the first it declined,
    relative (inf when it compared nothing); an exact tie declines alike in every run (equal scores share a source)."""
    close = [abs(g) for g in gaps if g != 0]
    return min(close) / _scale(scores) if close else math.inf


@dataclass
class ChoiceLog:
    entries: list[tuple[int, str, float]] = field(default_factory=list)  # (position, resident digest, margin)

    def note(self, position: int, resident: list[int], margin: float) -> None:
        digest = zlib.crc32(",".join(map(str, resident)).encode())
        self.entries.append((position, f"{digest:08x}", margin))

    def trim(self, start: int) -> None:
        """Positions from ``start`` on are gone (rejected drafts, a restart): their decisions are made again."""
        self.entries = [e for e in self.entries if e[0] < start]

    def line(self) -> str:
        return " ".join(f"{p}:{d}:{m:.4g}" for p, d, m in self.entries)


def parse(log: str) -> dict[str, list[tuple[int, str, float]]]:
    """Every ``log_choices`` line of a server log: request id -> its entries (a later line of one id replaces an
    earlier one: a preempted request's recompute decides again from its start)."""
    found = {}
    for text in log.splitlines():
        match = LINE.search(text)
        if match:
            entries = [item.split(":") for item in match.group(2).split()]
            found[match.group(1)] = [(int(p), d, float(m)) for p, d, m in entries]
    return found


def parting(a: list[tuple[int, str, float]], b: list[tuple[int, str, float]], tie: float,
            upto: int | None = None) -> tuple[str, str]:
    """Where two runs' choices part, among decisions before ``upto`` (the position of the first token the runs
    disagree on, after which their queries differ anyway): ("same", ...), ("tie", ...) when the first choice that
    differs was within ``tie`` in either run, else ("clear", ...)."""
    for (pa, da, ma), (pb, db, mb) in zip(a, b):
        if upto is not None and max(pa, pb) > upto:
            break
        if (pa, da) != (pb, db):
            margin = min(ma, mb)
            return ("tie" if margin <= tie else "clear"), f"chunk choices part at position {min(pa, pb)} " \
                                                         f"(closest call {margin:.4f})"
    return "same", "the same chunk choices"
