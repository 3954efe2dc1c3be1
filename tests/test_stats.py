"""Intervals in nemocascade/stats.py against hand-worked values."""
import numpy as np
import pytest

from nemocascade import stats


def test_wilson_matches_the_hand_worked_interval():
    # 42/100: centre (0.42 + z^2/200) / (1 + z^2/100) = 0.42297, half-width 0.094976 (z = 1.96)
    lo, hi = stats.wilson_ci95(42, 100)
    assert lo == pytest.approx(0.32798, abs=2e-5) and hi == pytest.approx(0.51794, abs=2e-5)
    assert stats.wilson_ci95(0, 10)[0] == 0.0 and stats.wilson_ci95(10, 10)[1] == pytest.approx(1.0)
    assert stats.mean_ci95([1] * 42 + [0] * 58) == stats.wilson_ci95(42, 100)  # binary scores: Wilson


def test_bootstrap_interval_of_partial_credit_scores_is_near_the_normal_one():
    x = np.random.default_rng(1).uniform(0, 1, 400)
    lo, hi = stats.mean_ci95(x)
    se = x.std(ddof=1) / np.sqrt(x.size)
    assert lo == pytest.approx(x.mean() - 1.96 * se, abs=0.004) and hi == pytest.approx(x.mean() + 1.96 * se, abs=0.004)
    assert stats.mean_ci95(x) == [lo, hi]  # fixed bootstrap seed: the same interval every time


def test_paired_difference_cancels_item_difficulty():
    before = np.array([1, 1, 0, 0, 1, 0, 1, 0] * 25, float)
    after = before.copy()
    after[:20] = 1  # 20 items gained, none lost: every resample's mean gain is >= 0
    gain, (lo, hi) = stats.paired_diff_ci95(before, after)
    assert gain == pytest.approx(sum(after - before) / 200) and lo >= 0 and hi > gain > lo
    assert stats.paired_diff_ci95(before, before) == (0.0, [0.0, 0.0])
    with pytest.raises(ValueError, match="same items"):
        stats.paired_diff_ci95(before, after[:-1])


def test_seed_interval_is_student_t():
    # mean 0.2, sd 0.1, n 3: t(0.975, 2) = 4.302653 -> half-width 0.248414
    lo, hi = stats.seeds_ci95([0.1, 0.2, 0.3])
    assert lo == pytest.approx(0.2 - 0.248414, abs=1e-6) and hi == pytest.approx(0.2 + 0.248414, abs=1e-6)
    assert stats.seeds_ci95([0.5]) is None
