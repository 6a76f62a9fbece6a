"""A paged request's chunk choices as a record two runs compare by (``luce.kvflash.log_choices``, pure)."""

import math
import logging

import torch

from tests.kvflash.test_pager import CHUNK, grow, pager
from vllm_luce.kvflash.choices import ChoiceLog, eviction_margin, parse, parting, swap_margin
from vllm_luce.kvflash.policies import Scorer

TIE = 0.03


def chunk_scores(nudge: dict[int, float] | None = None):
    """Chunk c scores 1 + c / 100 (newer chunks stay), moved by ``nudge`` (chunk -> added score): two runs whose
    rounding differs."""
    return Scorer(lambda p, chunks: torch.tensor([1 + c / 100 + (nudge or {}).get(c, 0.0) for c in chunks]))


def run(policy, steps=(3, 5, 2, 7, 1, 6, 4, 4, 4, 4)):
    """A request grown in steps of these many chunks, each ending with a one-token step, with its choices logged."""
    p = pager(pool_chunks=8, cold_chunks=4)
    p.choices = ChoiceLog()
    for chunks in steps:
        grow(p, chunks * CHUNK - 1, policy)
        grow(p, 1, policy)
    return p


def test_margins_measure_the_closest_call_relative_to_the_largest_score():
    scores = torch.tensor([4.0, 1.0, 1.2, 10.0])
    assert math.isclose(eviction_margin(scores, 1), 0.02, rel_tol=1e-5)  # evicts 1.0, keeps 1.2
    assert math.isclose(eviction_margin(scores, 2), 0.28, rel_tol=1e-5)
    assert eviction_margin(scores, 0) == eviction_margin(scores, 4) == math.inf  # no call made
    assert math.isclose(swap_margin([3.0, -0.5], scores), 0.05) and swap_margin([], scores) == math.inf
    # equal scores share a source (a chunk scores at least its predecessor): the cut among them is as far from moving
    # as the nearest other score
    tied = torch.tensor([2.0, 2.0, 1.0, 2.5, 10.0])
    assert math.isclose(eviction_margin(tied, 2), 0.05, rel_tol=1e-5) and swap_margin([0.0, 0.0], tied) == math.inf


def test_runs_that_choose_alike_log_the_same_choices_and_a_near_tied_flip_is_a_tie():
    alike = [run(chunk_scores()), run(chunk_scores())]
    assert alike[0].choices.entries and alike[0].choices.entries == alike[1].choices.entries
    assert parting(alike[0].choices.entries, alike[1].choices.entries, TIE)[0] == "same"
    near = run(chunk_scores({2: 0.011}))  # chunk 2 now outscores chunk 3 by 0.001: a rounding-sized flip
    kind, where = parting(alike[0].choices.entries, near.choices.entries, TIE)
    first = next(e[0] for e, f in zip(alike[0].choices.entries, near.choices.entries) if e[:2] != f[:2])
    assert kind == "tie" and f"part at position {first}" in where
    assert parting(alike[0].choices.entries, near.choices.entries, TIE, upto=first - 1)[0] == "same"  # tokens first
    # a choice far from a tie (0.2 in both runs) parting the runs is a clear one
    ours, theirs = [(8, "aa", 0.5), (16, "bb", 0.2)], [(8, "aa", 0.5), (16, "cc", 0.25)]
    assert parting(ours, theirs, TIE) == ("clear", "chunk choices part at position 16 (closest call 0.2000)")


def test_rejected_positions_take_their_choices_with_them_and_the_log_line_parses_back(caplog):
    p = run(chunk_scores())
    entries = list(p.choices.entries)
    cut = entries[-2][0]
    p.prepare(cut, 1, chunk_scores())  # a restart: the decisions from its position on are made again, or not at all
    assert [e for e in p.choices.entries if e[0] < cut] == [e for e in entries if e[0] < cut]
    assert all(e[0] <= cut for e in p.choices.entries) and len(p.choices.entries) < len(entries)
    with caplog.at_level(logging.INFO):
        logging.getLogger("t").info("x: KVFlash chunk choices of request cmpl-1-0-ab12cd34: %s", p.choices.line())
    (request, logged), = parse(caplog.text).items()
    assert request == "cmpl-1-0-ab12cd34" and [(q, d) for q, d, _ in logged] == [(q, d) for q, d, _ in
                                                                                p.choices.entries]
    assert all(math.isclose(a[2], b[2], rel_tol=1e-3) or a[2] == b[2] for a, b in zip(logged, p.choices.entries))
