"""Token-aware autoscaling: size the deployment by the tokens its replicas hold, not by requests.

Why: Serve's default policy counts ongoing requests, and for an LLM a request is the wrong unit. One
``/generate`` request may carry 256 long prompts and a chat request one short one; the engine's real load is
the KV cache those sequences hold (prompt + ``max_tokens`` each), which is exactly what the replica's batcher
admits against. So each replica reports its token load, and the policy asks for as many replicas as it takes
for each to hold about ``target_tokens``:

    desired replicas = (tokens held by all replicas + tokens waiting in callers' queues) / target_tokens

How it plugs into Ray Serve 2.60 (``autoscaling.metric: tokens`` in the app config):

- A replica reports custom metrics through its deployment's ``record_autoscaling_stats()`` method, which
  returns ``{name: number}`` (``Replica.record_autoscaling_stats`` calls :func:`replica_load`). Serve calls
  it every ``look_back_period_s / 5`` seconds and pushes the points to the controller every
  ``metrics_interval_s``.
- The controller hands the policy an ``AutoscalingContext`` whose ``aggregated_metrics[name][replica_id]`` is
  each replica's time-weighted mean over ``look_back_period_s``. The policy returns ``(replicas, state)``;
  a float is rounded up, and Serve itself applies ``min_replicas``/``max_replicas``, ``upscale_delay_s`` /
  ``downscale_delay_s`` and the up/down scaling factors around it (as it does for its default policy).
- The policy is given as ``autoscaling_config.policy = {"policy_function":
  "serve_app.serving.autoscaling:TokenAutoscalingPolicy", "policy_kwargs": {...}}``. A class is instantiated once
  with ``policy_kwargs`` (a plain function would get none), so it can carry ``target_tokens``. Serve pickles
  this module by value into its controller, so it imports nothing from the app at module level.

The default ``target_tokens`` is each replica's in-flight token budget (``batcher.max_inflight_tokens``; with
``auto`` the engine's KV cache; in batch mode ``target_batch_tokens x max_concurrent_batches``): the engine can
run that much at once, so a replica holding more has requests waiting for admission. That is the point at
which another replica shortens the queue instead of sitting idle, the same rule as
``target_ongoing_requests == batcher.max_inflight`` for the request metric, counted in the engine's unit.
"""

from __future__ import annotations

from typing import Any

TOKEN_LOAD = "token_load"
"""Custom metric: token cost (prompt + max_tokens) queued in the replica's batcher plus in its engine."""
TOKEN_BUDGET = "token_budget"
"""Custom metric: what the replica's engine holds at once (its in-flight token budget)."""
PROMPTS = "prompts"
"""Custom metric: prompts queued plus in flight (to price requests still waiting in callers' queues)."""

POLICY_PATH = "serve_app.serving.autoscaling:TokenAutoscalingPolicy"


def replica_load(stats: Any, batch_budget: int | None = None, max_priority: int | None = None) -> dict[str, float]:
    """A replica's custom autoscaling metrics from its batcher's statistics (either mode's).

    Continuous mode tracks the cost in flight and its budget, per priority too; batch mode only counts records
    in flight, so their cost is estimated at the mean cost per record so far, and its budget (``batch_budget``)
    is what ``max_concurrent_batches`` batches of ``target_batch_tokens`` hold. With ``max_priority``, only the
    tokens of requests of that priority or a higher one (a smaller number) count.
    """
    in_flight_cost = stats.in_flight_cost
    if not stats.budget and stats.in_flight and stats.avg_batch_size:
        in_flight_cost = stats.in_flight * stats.avg_batch_cost / stats.avg_batch_size
    load = stats.queued_cost + in_flight_cost
    by_priority = getattr(stats, "tokens_by_priority", None)
    if max_priority is not None and by_priority is not None:
        load = sum(tokens for priority, tokens in by_priority.items() if priority <= max_priority)
    return {
        TOKEN_LOAD: float(load),
        TOKEN_BUDGET: float(stats.budget or batch_budget or 0),
        PROMPTS: float(stats.queue_depth + stats.in_flight),
    }


class TokenAutoscalingPolicy:
    """A Ray Serve deployment autoscaling policy on tokens (see the module docstring).

    Args:
        target_tokens: token load each replica should hold; ``None``: the mean in-flight budget the replicas
            report (``token_budget``).

    Called with an ``AutoscalingContext``; returns ``(desired replicas as a float, state)``. Until any replica
    has reported (a replica just started, or a deployment without ``record_autoscaling_stats``) it falls
    back to Serve's request rule, ongoing requests / ``target_ongoing_requests``, so it never stalls.
    """

    def __init__(self, target_tokens: int | None = None) -> None:
        if target_tokens is not None and target_tokens <= 0:
            raise ValueError(f"target_tokens must be > 0, got {target_tokens}")
        self.target_tokens = target_tokens

    def __call__(self, ctx: Any) -> tuple[float, dict[str, Any]]:
        metrics = ctx.aggregated_metrics or {}
        loads = metrics.get(TOKEN_LOAD) or {}
        budgets = [b for b in (metrics.get(TOKEN_BUDGET) or {}).values() if b > 0]
        target = self.target_tokens or (sum(budgets) / len(budgets) if budgets else None)
        if not loads or not target:
            if ctx.current_num_replicas == 0:
                return ctx.target_num_replicas, {}
            requests = ctx.total_num_requests / ctx.config.get_target_ongoing_requests()
            return requests, {"basis": "requests"}
        held = sum(loads.values())
        prompts = sum((metrics.get(PROMPTS) or {}).values())
        # Requests still queued in callers (every replica at max_ongoing_requests, or none up) hold no
        # tokens at a replica yet: price each at the tokens per prompt the replicas hold now.
        waiting = (ctx.total_queued_requests or 0.0) * (held / prompts) if prompts > 0 else 0.0
        desired = (held + waiting) / target
        return desired, {"basis": "tokens", "tokens": round(held + waiting), "target_tokens": round(target)}
