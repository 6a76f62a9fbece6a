"""The two-sample test behind tests/e2e/test_dflash_sampling.py (``fixtures/homogeneity.py``, pure): its p-values
are the chi-square distribution's, it accepts samples of one distribution at its nominal rate and rejects a biased
one."""

import math
import random

import pytest

from fixtures.homogeneity import REST, binned, chi_square_survival, homogeneity_test


def integrated_survival(x: float, df: int, steps: int = 100_000) -> float:
    """1 - CDF by the midpoint rule over the chi-square density, an independent check of the closed form. In
    u = sqrt(t) the density 2 c u^(df - 1) exp(-u^2 / 2) is smooth at 0, also for one degree of freedom."""
    log_norm = math.log(2) - (df / 2) * math.log(2) - math.lgamma(df / 2)
    width = math.sqrt(x) / steps
    cdf = sum(math.exp(log_norm + (df - 1) * math.log(u) - u * u / 2)
              for u in ((i + 0.5) * width for i in range(steps))) * width
    return 1.0 - cdf


@pytest.mark.parametrize("df", [1, 2, 3, 7, 10, 31])
@pytest.mark.parametrize("x", [0.5, 4.0, 20.0])
def test_survival_is_the_chi_square_distributions(df, x):
    assert chi_square_survival(x, df) == pytest.approx(integrated_survival(x, df), abs=2e-4)


def test_survival_at_table_quantiles_and_in_the_far_tail():
    # 95% quantiles from any chi-square table
    for x, df in ((3.841459, 1), (5.991465, 2), (18.307038, 10), (43.772972, 30)):
        assert chi_square_survival(x, df) == pytest.approx(0.05, rel=1e-5)
    assert chi_square_survival(40.0, 2) == pytest.approx(math.exp(-20.0))
    assert chi_square_survival(2000.0, 5) < 1e-300 and chi_square_survival(1.0, 400) == pytest.approx(1.0)
    assert chi_square_survival(0.0, 3) == 1.0


def draws(rng: random.Random, weights: dict, n: int, stratum="s") -> list[tuple]:
    outcomes = rng.choices(list(weights), weights=list(weights.values()), k=n)
    return [(stratum, o) for o in outcomes]


BASE = {"a": 0.4, "b": 0.25, "c": 0.15, "d": 0.1, "e": 0.05, "f": 0.03, "g": 0.02}


@pytest.mark.parametrize("size_a, size_b", [(300, 300), (80, 400)])
def test_samples_of_one_distribution_are_rejected_at_the_nominal_rate(size_a, size_b):
    rng, level, trials = random.Random(size_a), 0.05, 400
    rejected = sum(homogeneity_test(draws(rng, BASE, size_a), draws(rng, BASE, size_b)).p_value < level
                   for _ in range(trials))
    # Binomial(400, 0.05): mean 20, sd 4.4; the bounds are about 3 sd out.
    assert 7 <= rejected <= 34, rejected


def test_a_biased_sample_is_rejected_and_an_identical_one_is_not():
    rng = random.Random(1)
    shifted = dict(BASE, a=0.32, b=0.33)  # 8 points of probability moved from one outcome to another
    reference, same = draws(rng, BASE, 2000), draws(rng, BASE, 2000)
    assert homogeneity_test(reference, draws(rng, shifted, 2000)).p_value < 1e-6
    assert homogeneity_test(reference, same).p_value > 1e-3
    exact = homogeneity_test(reference, list(reference))
    assert exact.statistic == 0.0 and exact.p_value == 1.0


def test_strata_are_separate_tables():
    """The same outcome in two strata is two categories; a bias in one stratum is found beside unbiased ones."""
    rng = random.Random(2)
    a = draws(rng, BASE, 500, "p") + draws(rng, {"x": 0.5, "y": 0.5}, 500, "q")
    b = draws(rng, BASE, 500, "p") + draws(rng, {"x": 0.5, "y": 0.5}, 500, "q")
    result = homogeneity_test(a, b)
    assert result.degrees_of_freedom == (len(BASE) - 1) + 1 and result.categories == len(BASE) + 2
    biased = draws(rng, BASE, 500, "p") + draws(rng, {"x": 0.2, "y": 0.8}, 500, "q")
    assert homogeneity_test(a, biased).p_value < 1e-6


def test_rare_outcomes_share_a_category_so_every_expected_count_is_large():
    from collections import Counter

    assert binned(Counter({"a": 50, "b": 12, "c": 4, "d": 3, "e": 4}), 10) == {
        "a": "a", "b": "b", "c": REST, "d": REST, "e": REST}
    # the rare ones together are still rare: they join the smallest kept outcome
    assert binned(Counter({"a": 50, "b": 12, "c": 4, "d": 3}), 10) == {"a": "a", "b": REST, "c": REST, "d": REST}
    rng = random.Random(3)
    long_tail = {f"t{i}": 1.0 / (i + 1) ** 2 for i in range(200)}
    result = homogeneity_test(draws(rng, long_tail, 400), draws(rng, long_tail, 400))
    assert result.categories < 2 * 40  # 400 + 400 draws in cells of at least 10 (5 expected in each sample)
    small = homogeneity_test(draws(rng, long_tail, 100), draws(rng, long_tail, 400))
    assert small.categories < 2 * 20  # cells of at least 25 draws: 5 expected in the sample of 100


def test_nothing_to_compare_is_an_error():
    with pytest.raises(ValueError, match="two categories"):
        homogeneity_test([("s", "a")] * 20, [("s", "a")] * 20)
    with pytest.raises(ValueError, match="one sample only"):
        homogeneity_test([("s", "a")] * 20, [("t", "a")] * 20)
    with pytest.raises(ValueError, match="degrees of freedom"):
        chi_square_survival(1.0, 0)
