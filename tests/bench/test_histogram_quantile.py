"""The benchmarks' histogram quantile: Prometheus' histogram_quantile over cumulative buckets."""

from __future__ import annotations

import math

from bench.e2e_figures import histogram_quantile as quantile


def test_quantile_interpolates_within_the_bucket_like_prometheus() -> None:
    buckets = [(0.1, 50.0), (0.5, 90.0), (1.0, 100.0), (math.inf, 100.0)]
    assert quantile(buckets, 0.5) == 0.1  # the 50th of 100 is the top of the first bucket
    assert abs(quantile(buckets, 0.7) - 0.3) < 1e-9  # 20 of the 40 in (0.1, 0.5]
    assert abs(quantile(buckets, 0.99) - 0.95) < 1e-9
    assert quantile([(0.1, 0.0), (math.inf, 0.0)], 0.99) is None


def test_an_observation_past_the_last_bound_reports_that_bound() -> None:
    assert quantile([(0.1, 1.0), (math.inf, 10.0)], 0.99) == 0.1
