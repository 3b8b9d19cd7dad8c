"""Percentiles of measured values, as the batcher's own statistics take them."""

from __future__ import annotations

import math
from collections.abc import Iterable

from batching.stats import percentile as sorted_percentile


def percentile(values: Iterable[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0-100) of ``values`` in any order; NaN when there are none (a benchmark row
    must not show 0 for "nothing measured")."""
    ordered = sorted(values)
    return sorted_percentile(ordered, q) if ordered else math.nan
