"""95% intervals for what a run reports (docs/run_output.md: every evaluation carries `n` and `ci95`).

  mean_ci95(scores)          one evaluation: Wilson score interval when every score is 0 or 1 (pass@1 of a
                             verifiable reward), else a percentile bootstrap of the mean (partial-credit rewards)
  paired_diff_ci95(a, b)     mean(b - a) over the same items, with a paired percentile bootstrap interval
  seeds_ci95(values)         the mean over seeds with a Student-t interval (None for a single seed)

Intervals are [low, high] lists of floats (JSON as is). Bootstraps use a fixed seed: the same scores always give
the same interval.
"""
from __future__ import annotations

import math

import numpy as np
from scipy import stats as _scipy_stats  # a jax dependency already: the t quantile, nothing more

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile
N_BOOT = 2000


def wilson_ci95(k: int, n: int) -> list[float]:
    """Wilson score interval for k successes in n trials; [0, 1] when n = 0."""
    if n == 0:
        return [0.0, 1.0]
    p = k / n
    denom = 1 + Z95 ** 2 / n
    centre = (p + Z95 ** 2 / (2 * n)) / denom
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95 ** 2 / (4 * n * n)) / denom
    return [max(0.0, centre - half), min(1.0, centre + half)]


def mean_ci95(scores) -> list[float]:
    """95% interval of the mean of per-item `scores` (see the module docstring)."""
    x = np.asarray(scores, np.float64)
    if x.size == 0:
        return [0.0, 1.0]
    if np.all((x == 0) | (x == 1)):
        return wilson_ci95(int(x.sum()), int(x.size))
    return _bootstrap(lambda idx: x[idx].mean(axis=1), x.size)


def paired_diff_ci95(before, after) -> tuple[float, list[float]]:
    """(mean of after - before, its 95% interval) over items scored twice (the same test items after two
    stages): resampling items keeps each item's pair together, so item difficulty cancels."""
    a, b = np.asarray(before, np.float64), np.asarray(after, np.float64)
    if a.shape != b.shape:
        raise ValueError(f"paired scores need the same items: {a.shape} vs {b.shape}")
    d = b - a
    if d.size == 0:
        return 0.0, [0.0, 0.0]
    return float(d.mean()), _bootstrap(lambda idx: d[idx].mean(axis=1), d.size)


def seeds_ci95(values) -> list[float] | None:
    """Student-t 95% interval of the mean over seeds (one value per seed); None with fewer than two seeds."""
    v = np.asarray(values, np.float64)
    if v.size < 2:
        return None
    half = _scipy_stats.t.ppf(0.975, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size)
    return [float(v.mean() - half), float(v.mean() + half)]


def percent(mean: float, ci95=None, signed: bool = False) -> str:
    """A fraction and its interval as table text in percent points: "55.0 [47.4, 67.8]" ("+16.7 [+5.0, +28.3]" when
    `signed`, for gains); the mean alone when there is no interval (one seed)."""
    text = ("{:+.1f}" if signed else "{:.1f}").format(100 * mean)
    return text if ci95 is None else f"{text} {percent_interval(ci95, signed)}"


def percent_interval(ci95, signed: bool = False) -> str:
    """"[low, high]" in percent points ("[+5.0, +28.3]" when `signed`)."""
    f = "{:+.1f}" if signed else "{:.1f}"
    return f"[{f.format(100 * ci95[0])}, {f.format(100 * ci95[1])}]"


def _bootstrap(mean_of, n: int) -> list[float]:
    idx = np.random.default_rng(0).integers(0, n, (N_BOOT, n))
    means = mean_of(idx)
    return [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]
