"""benchmarks/dflash_gpu.py's table: each engine's ratio to no speculation and gated's to the better of none and fixed,
with the goals it misses."""

from benchmarks.dflash_gpu import table


def engine(*rates):
    return {"cells": [{"concurrency": c, "tokens_per_s": r} for c, r in zip((1, 4), rates)]}


def test_ratios_are_to_no_speculation_and_gated_to_the_better_of_none_and_fixed():
    results = {"none": engine(100, 400), "control": engine(102, 396), "gated@0.9": engine(500, 1200),
               "fixed@0.9": engine(520, 1200), "gated@0.0": engine(98, 380), "fixed@0.0": engine(70, 200)}
    rows, misses = table(results, [0.0, 0.9], [1, 4])
    assert [r["gated/best"] for r in rows] == [0.98, 0.95, round(5.0 / 5.2, 3), 1.0]
    assert rows[0]["control/none"] == 1.02 and rows[1]["fixed/none"] == 0.5
    assert misses == ["p=0.0 c=4: gated 0.95x the better of none and fixed",
                      "p=0.9 c=1: gated 0.962x the better of none and fixed"]
