"""Replica metrics through ``ray.serve.metrics``, so Ray's Prometheus endpoint exports them; the replica's core
reports to them as its :class:`~serve_app.core.base.Observer`.

Names (Ray adds its ``ray_`` prefix on export), each tagged with the model:

- ``token_batcher_request_tokens`` (histogram): token cost (prompt + max_tokens) of each request entering the engine
- ``token_batcher_queue_wait_seconds`` (histogram): time from validation to the engine, per request
- ``token_batcher_batch_size``, ``token_batcher_batch_tokens`` (histograms): requests and token cost per batch, in
  batch mode only (continuous admission has no batches: a request enters alone)
- ``token_batcher_queue_depth`` (gauge): requests waiting in the replica's batcher
- ``token_batcher_inflight_requests``, ``token_batcher_inflight_tokens`` (gauges): requests and their token cost
  inside the engine
- ``token_batcher_budget_occupancy`` (gauge): in-flight tokens over the in-flight budget (continuous mode)
- ``token_batcher_utilization`` (gauge): fraction of time the engine had work
- ``token_batcher_rejected_total`` (counter): requests refused with 503 because the queue was full
"""

from __future__ import annotations

from typing import Any

_SIZE_BOUNDARIES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
_TOKEN_BOUNDARIES = [64, 256, 1024, 4096, 8192, 16384, 32768, 65536, 131072]
_WAIT_BOUNDARIES = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30]


class ReplicaMetrics:
    """The replica's batching metrics (see the module's docstring)."""

    def __init__(self, model: str) -> None:
        from ray.serve import metrics

        self._metrics = metrics
        self._tags = {"model": model}
        self.request_tokens = self._histogram(
            "token_batcher_request_tokens", "Token cost per request entering the engine.", _TOKEN_BOUNDARIES
        )
        self.queue_wait = self._histogram(
            "token_batcher_queue_wait_seconds", "Seconds from validation to the engine.", _WAIT_BOUNDARIES
        )
        self.batch_size: Any = None  # made at the first batch: continuous admission has none
        self.batch_tokens: Any = None
        self.gauges = {
            name: self._tagged(metrics.Gauge(f"token_batcher_{name}", text, ("model",)))
            for name, text in (
                ("queue_depth", "Requests queued in the batcher."),
                ("inflight_requests", "Requests inside the engine."),
                ("inflight_tokens", "Token cost inside the engine."),
                ("budget_occupancy", "In-flight tokens over the in-flight budget."),
                ("utilization", "Fraction of time the engine had work."),
            )
        }
        self.rejected_total = self._tagged(
            metrics.Counter("token_batcher_rejected_total", "Requests refused (queue full).", ("model",))
        )

    def _tagged(self, metric: Any) -> Any:
        metric.set_default_tags(dict(self._tags))  # a fresh dict each: Ray adds its own tags to it
        return metric

    def _histogram(self, name: str, text: str, boundaries: list[float]) -> Any:
        return self._tagged(self._metrics.Histogram(name, text, boundaries, ("model",)))

    def started(self, costs: list[int], waits: list[float], batch: bool) -> None:
        """Requests entering the engine (as one batch when ``batch``)."""
        for cost, wait in zip(costs, waits):
            self.request_tokens.observe(cost)
            self.queue_wait.observe(wait)
        if batch:
            if self.batch_size is None:
                self.batch_size = self._histogram(
                    "token_batcher_batch_size", "Requests per batch sent to the engine.", _SIZE_BOUNDARIES
                )
                self.batch_tokens = self._histogram(
                    "token_batcher_batch_tokens", "Token cost per batch.", _TOKEN_BOUNDARIES
                )
            self.batch_size.observe(len(costs))
            self.batch_tokens.observe(sum(costs))

    def rejected(self, count: int) -> None:
        """Requests refused: the queue was full."""
        self.rejected_total.inc(count)

    def update(self, stats: Any) -> None:
        """Refresh the gauges from a batcher's statistics snapshot (either mode's)."""
        values = {
            "queue_depth": stats.queue_depth,
            "inflight_requests": stats.in_flight,
            "inflight_tokens": stats.in_flight_cost,
            "budget_occupancy": stats.budget_occupancy,
            "utilization": stats.utilization,
        }
        for name, value in values.items():
            self.gauges[name].set(value)
