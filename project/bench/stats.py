"""Small statistics for the benchmark: percentiles, Jain's fairness index, CDF samples."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) by linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def latency_summary(latencies_us: Sequence[int]) -> dict[str, float | None]:
    """p50 / p90 / p99 / max of latencies given in microseconds, in milliseconds."""

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value / 1000, 3)

    return {
        "p50_ms": ms(percentile(latencies_us, 50)),
        "p90_ms": ms(percentile(latencies_us, 90)),
        "p99_ms": ms(percentile(latencies_us, 99)),
        "max_ms": ms(max(latencies_us) if latencies_us else None),
        "n": len(latencies_us),
    }


def jain(values: Sequence[float]) -> float | None:
    """Jain's fairness index: 1 when everyone got the same, 1/n when one got everything."""
    if not values:
        return None
    total = sum(values)
    squares = sum(v * v for v in values)
    return 1.0 if squares == 0 else (total * total) / (len(values) * squares)


def cdf_sample(values: Sequence[float], points: int = 200) -> list[float]:
    """At most ``points`` values of the sorted sample, evenly spaced by rank (for plotting)."""
    ordered = sorted(values)
    if len(ordered) <= points:
        return ordered
    step = (len(ordered) - 1) / (points - 1)
    return [ordered[round(i * step)] for i in range(points)]
