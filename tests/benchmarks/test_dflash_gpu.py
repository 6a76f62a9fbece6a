"""benchmarks/dflash_gpu.py's table: ratios to the right baseline, in both layouts (engines spread over cards, or
each level's engines on one card with its own baseline)."""

from benchmarks.dflash_gpu import table


def engine(*rates):
    return {"cells": [{"concurrency": c, "tokens_per_s": r} for c, r in zip((1, 4), rates)]}


def test_spread_layout_compares_every_level_with_the_one_baseline():
    results = {"none": engine(100, 400), "control": engine(102, 396), "gated@0.9": engine(500, 1200),
               "fixed@0.9": engine(520, 1200)}
    (one, four), misses = table(results, [0.9], [1, 4])
    assert one["control/none"] == 1.02 and one["gated/best"] == round(5.0 / 5.2, 3) and four["gated/best"] == 1.0
    assert misses == ["p=0.9 c=1: gated 0.962x the better of none and fixed"]


def test_same_card_layout_compares_each_level_with_its_own_baseline():
    results = {"none@0.0": engine(100, 400), "gated@0.0": engine(98, 396), "fixed@0.0": engine(80, 300),
               "none@0.9": engine(90, 380), "gated@0.9": engine(450, 1140), "control@0.9": engine(91, 380)}
    rows, misses = table(results, [0.0, 0.9], [1, 4])
    assert [r["gated/best"] for r in rows] == [0.98, 0.99, 5.0, 3.0]
    assert rows[2]["control/none"] == round(91 / 90, 3) and rows[0]["control/none"] is None and not misses
