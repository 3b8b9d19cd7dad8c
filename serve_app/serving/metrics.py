"""Replica metrics through ``ray.serve.metrics``, so Ray's Prometheus endpoint exports them.

Names (Ray adds its ``ray_`` prefix on export):

- ``token_batcher_batch_size`` (histogram): records per batch sent to the engine (1 per admission in
  continuous mode)
- ``token_batcher_batch_tokens`` (histogram): token cost (prompt + max_tokens) per batch or admission
- ``token_batcher_queue_wait_seconds`` (histogram): time from validation to the engine, per request
- ``token_batcher_queue_depth`` (gauge): prompts waiting in the replica's batcher
- ``token_batcher_utilization`` (gauge): fraction of time the engine had work
- ``token_batcher_inflight_tokens`` (gauge): token cost inside the engine (continuous mode)
- ``token_batcher_budget_occupancy`` (gauge): in-flight tokens / the in-flight budget (continuous mode)
- ``token_batcher_rejected_total`` (counter): prompts refused with 503 because the queue was full
"""

from __future__ import annotations

from batching import BatchStats

_SIZE_BOUNDARIES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
_TOKEN_BOUNDARIES = [64, 256, 1024, 4096, 8192, 16384, 32768, 65536, 131072]
_WAIT_BOUNDARIES = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30]


class ReplicaMetrics:
    """The replica's batching metrics; every series is tagged with the model name."""

    def __init__(self, model: str) -> None:
        from ray.serve import metrics

        self.batch_size = metrics.Histogram(
            "token_batcher_batch_size", "Records per batch sent to the engine.", _SIZE_BOUNDARIES, ("model",)
        )
        self.batch_tokens = metrics.Histogram(
            "token_batcher_batch_tokens", "Token cost per batch (prompt + max_tokens).", _TOKEN_BOUNDARIES, ("model",)
        )
        self.queue_wait = metrics.Histogram(
            "token_batcher_queue_wait_seconds", "Seconds from validation to the engine.", _WAIT_BOUNDARIES, ("model",)
        )
        self.queue_depth = metrics.Gauge("token_batcher_queue_depth", "Prompts queued in the batcher.", ("model",))
        self.utilization = metrics.Gauge(
            "token_batcher_utilization", "Fraction of time the engine had a batch.", ("model",)
        )
        self.inflight_tokens = metrics.Gauge(
            "token_batcher_inflight_tokens", "Token cost inside the engine.", ("model",)
        )
        self.occupancy = metrics.Gauge(
            "token_batcher_budget_occupancy", "In-flight tokens over the in-flight budget.", ("model",)
        )
        self.rejected = metrics.Counter("token_batcher_rejected_total", "Prompts refused (queue full).", ("model",))
        gauges = (self.queue_depth, self.utilization, self.inflight_tokens, self.occupancy)
        for metric in (self.batch_size, self.batch_tokens, self.queue_wait, *gauges):
            metric.set_default_tags({"model": model})  # a fresh dict each: Ray adds its own tags to it
        self.rejected.set_default_tags({"model": model})

    def observe_batch(self, size: int, tokens: int, waits: list[float]) -> None:
        """Record one batch on its way into the engine."""
        self.batch_size.observe(size)
        self.batch_tokens.observe(tokens)
        for wait in waits:
            self.queue_wait.observe(wait)

    def update(self, stats: BatchStats) -> None:
        """Refresh the gauges from a batcher snapshot."""
        self.queue_depth.set(stats.queue_depth)
        self.utilization.set(stats.utilization)
        self.inflight_tokens.set(stats.in_flight_cost)
        self.occupancy.set(stats.budget_occupancy)
