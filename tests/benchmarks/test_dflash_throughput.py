"""The throughput benchmark's round orders: each engine in each place of a round, and directly after each other engine,
equally often (a rotating order kept every engine behind the same one)."""

from collections import Counter

import pytest

from benchmarks.dflash_throughput import round_orders


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6])
def test_round_orders_are_balanced_for_place_and_predecessor(n):
    names = [f"engine{i}" for i in range(n)]
    rows = 2 * n if n % 2 else n
    orders = round_orders(names, rows)
    assert all(sorted(order) == names for order in orders)
    places = Counter((name, i) for order in orders for i, name in enumerate(order))
    follows = Counter((a, b) for order in orders for a, b in zip(order, order[1:]))
    assert set(places.values()) == {rows // n} and len(places) == n * n
    assert set(follows.values()) == {rows // n} and len(follows) == n * (n - 1)


def test_round_orders_repeat_the_square_past_its_rows():
    orders = round_orders(["none", "gated", "none2", "gated2"], 10)
    assert orders[4:8] == orders[:4] and orders[8:] == orders[:2]
