"""Pool the engine sets of earlier ``dflash_throughput`` runs and say how sure each goal ratio is.

    python -m benchmarks.dflash_throughput_pool docs/data/dflash_throughput/*.json [--pairs wrong]

Each file is a ``dflash_throughput --json`` output. Every engine set in it (one child instance; a run without
``--instances`` has one per pair) counts once, so runs made apart, with the same arguments and code, pool as if one
run had built all their sets. The table is ``dflash_throughput``'s over the pooled rounds. Below it, per pair and
concurrency: the goal ratio of each set (both gated engines over both plain ones, ``pair / pair``, else gated over
none; on a pair where fixed DFlash beats no speculation, also gated over fixed), how many sets read below the goal,
and a percentile bootstrap of the pooled ratio over sets. The bootstrap resamples whole sets because a set is the unit
that carries an engine's bias: identical engines can differ by far more than the round-to-round noise a median over
rounds already absorbs (the runs in docs/data/dflash_throughput/).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from benchmarks.dflash_throughput import (GOAL_VS_FIXED, GOAL_VS_NONE, paired, pair_over_pair, pool_instances,
                                         summarize)

RESAMPLES = 1000


def engine_sets(paths: list[Path], pairs: list[str] | None = None) -> list[dict]:
    """The rows of every engine set in ``paths`` (their ``instance_rows``, else ``rows``), each set numbered apart
    (``instance``) in file order, optionally only ``pairs``."""
    rows, sets = [], 0
    for path in paths:
        data = json.loads(Path(path).read_text())
        numbered: dict[int, int] = {}  # the file's instance -> its set number (one number across the file's pairs)
        for row in data["instance_rows" if "instance_rows" in data else "rows"]:
            if pairs is None or row["pair"] in pairs:
                number = numbered.setdefault(row.get("instance", 0), sets + len(numbered))
                rows.append({**row, "instance": number})
        sets += len(numbered)
    return rows


def cell(rows: list[dict], pair: str, concurrency: int) -> dict[str, dict]:
    """One pair and concurrency of ``rows``, pooled: mode -> row."""
    return {r["mode"]: r for r in pool_instances([r for r in rows if r["pair"] == pair
                                                  and r["concurrency"] == concurrency])}


def gated_vs_none(modes: dict[str, dict]) -> float:
    """The goal's ratio against no speculation: ``pair / pair`` where both twins ran, else gated over none."""
    if "control" in modes and "gated2" in modes:
        return pair_over_pair(modes["gated"], modes["gated2"], modes["none"], modes["control"])
    return paired(modes["gated"], modes["none"])


def fixed_wins(modes: dict[str, dict]) -> bool:
    return "fixed" in modes and paired(modes["fixed"], modes["none"]) > 1.0


def bootstrap(rows: list[dict], pair: str, concurrency: int, statistic, resamples: int = RESAMPLES,
              seed: int = 0) -> tuple[float, float]:
    """The 5th and 95th percentiles of ``statistic`` of the pooled cell over ``resamples`` draws of as many engine
    sets as ``rows`` holds, with replacement (each draw renumbered, so a set drawn twice pools twice)."""
    sets = sorted({r["instance"] for r in rows if r["pair"] == pair and r["concurrency"] == concurrency})
    by_set = {s: [r for r in rows if r["instance"] == s and r["pair"] == pair and r["concurrency"] == concurrency]
              for s in sets}
    draw = random.Random(seed)
    values = []
    for _ in range(resamples):
        picked = [dict(r, instance=i) for i in range(len(sets)) for r in by_set[draw.choice(sets)]]
        values.append(statistic(cell(picked, pair, concurrency)))
    values.sort()
    return values[int(0.05 * resamples)], values[int(0.95 * resamples) - 1]


def sureness(rows: list[dict]) -> str:
    """Per pair and concurrency, each goal ratio: per set, sets below the goal, pooled and its bootstrap interval."""
    lines = ["| pair | concurrency | ratio | sets | per set | below goal | pooled | bootstrap 90% |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for pair, c in sorted({(r["pair"], r["concurrency"]) for r in rows}):
        pooled = cell(rows, pair, c)
        if "none" not in pooled or "gated" not in pooled:
            continue
        checks = [("gated vs none", gated_vs_none, GOAL_VS_NONE)]
        if fixed_wins(pooled):
            checks.append(("gated / fixed", lambda m: paired(m["gated"], m["fixed"]), GOAL_VS_FIXED))
        sets = sorted({r["instance"] for r in rows if r["pair"] == pair and r["concurrency"] == c})
        for name, statistic, goal in checks:
            per_set = [statistic(cell([r for r in rows if r["instance"] == s], pair, c)) for s in sets]
            low, high = bootstrap(rows, pair, c, statistic)
            lines.append(f"| {pair} | {c} | {name} | {len(sets)} | {' '.join(f'{x:.3f}' for x in per_set)} | "
                         f"{sum(x < goal for x in per_set)} | {statistic(pooled):.3f} | {low:.3f}-{high:.3f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="dflash_throughput --json outputs")
    ap.add_argument("--pairs", nargs="+", help="only these pairs")
    args = ap.parse_args(argv)
    rows = engine_sets(args.runs, args.pairs)
    if not rows:
        ap.error(f"no rows for pairs {args.pairs} in {[str(p) for p in args.runs]}")
    print(summarize(pool_instances(rows)))
    print()
    print(sureness(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
