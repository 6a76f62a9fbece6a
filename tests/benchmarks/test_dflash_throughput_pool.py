"""Pooling earlier throughput runs: each engine set counts once, its goal ratio is its own, and the bootstrap over sets
spans what the sets read."""

import json

import pytest

from benchmarks import dflash_throughput_pool as P


def row(mode, rates, pair="wrong", c=4, **extra):
    return {"pair": pair, "mode": mode, "concurrency": c, "tokens": 4 * 192, "tok_per_s": rates[0],
            "tok_per_s_passes": list(rates), "peak_running": c, **extra}


def engine_set(ratio, pair="wrong", c=4, fixed=None, **extra):
    """Five engines whose gated ones run at ``ratio`` of the plain ones in every round (three rounds, the host's
    speed drifting between them)."""
    plain = [1000.0, 800.0, 1200.0]
    rows = [row(m, plain, pair, c, **extra) for m in ("none", "control")]
    rows += [row(m, [ratio * p for p in plain], pair, c, **extra) for m in ("gated", "gated2")]
    if fixed is not None:
        rows.append(row("fixed", [fixed * p for p in plain], pair, c, **extra))
    return rows


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_every_engine_set_of_every_file_counts_once(tmp_path):
    two_sets = write(tmp_path, "a.json", {"rows": [], "instance_rows": engine_set(0.96, instance=0)
                                          + engine_set(0.94, instance=1)})
    one_set = write(tmp_path, "b.json", {"rows": engine_set(0.97)})  # a single-pair, single-set run
    rows = P.engine_sets([two_sets, one_set])
    assert sorted({r["instance"] for r in rows}) == [0, 1, 2]
    per_set = [P.gated_vs_none(P.cell([r for r in rows if r["instance"] == s], "wrong", 4)) for s in range(3)]
    assert per_set == pytest.approx([0.96, 0.94, 0.97])
    assert P.engine_sets([two_sets], pairs=["right"]) == []


def test_bootstrap_spans_the_sets_and_collapses_when_they_agree(tmp_path):
    rows = P.engine_sets([write(tmp_path, "a.json", {"rows": engine_set(0.96)}),
                          write(tmp_path, "b.json", {"rows": engine_set(0.96)})])
    assert P.bootstrap(rows, "wrong", 4, P.gated_vs_none, resamples=50) == pytest.approx((0.96, 0.96))
    rows = P.engine_sets([write(tmp_path, f"{r}.json", {"rows": engine_set(r)}) for r in (0.90, 0.95, 1.0, 1.05)])
    low, high = P.bootstrap(rows, "wrong", 4, P.gated_vs_none)
    assert 0.90 <= low < high <= 1.05


def test_sureness_counts_sets_below_each_goal_and_checks_fixed_only_where_it_wins(tmp_path):
    wrong = [write(tmp_path, f"w{r}.json", {"rows": engine_set(r, fixed=0.4)}) for r in (0.93, 0.96, 0.97)]
    right = [write(tmp_path, f"r{r}.json", {"rows": engine_set(5.0 * r, pair="right", fixed=5.0)})
             for r in (0.85, 0.95)]
    lines = P.sureness(P.engine_sets(wrong + right)).splitlines()[2:]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    assert [(c[0], c[2], c[3], c[5]) for c in cells] == [
        ("right", "gated vs none", "2", "0"), ("right", "gated / fixed", "2", "1"),
        ("wrong", "gated vs none", "3", "1")]
    assert cells[1][4] == "0.850 0.950" and cells[2][4] == "0.930 0.960 0.970"


def test_no_rows_for_the_pairs_asked_is_an_error(tmp_path, capsys):
    path = write(tmp_path, "a.json", {"rows": engine_set(0.96)})
    with pytest.raises(SystemExit):
        P.main([str(path), "--pairs", "trained"])
    assert "no rows for pairs ['trained']" in capsys.readouterr().err
    assert P.main([str(path)]) == 0
    assert "| wrong | 4 | gated vs none | 1 | 0.960 | 0 | 0.960 | 0.960-0.960 |" in capsys.readouterr().out
