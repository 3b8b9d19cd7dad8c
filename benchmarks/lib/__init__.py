"""What only the benchmarks share: their reports (tables, pages, plots), their peers' model, dtype and environment,
and ``make bench``'s sections. What the test suite needs too lives in ``harness``."""
