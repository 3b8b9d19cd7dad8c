"""The Serve deployment options a config implies (resources, limits, backpressure, autoscaling, draining, health
checks): one function for both applications, which share these settings (``DeploymentConfig``)."""

from __future__ import annotations

from typing import Any

from ..config import DeploymentConfig
from ..errors import RETRY_AFTER_S
from .autoscaling import POLICY_PATH

ROUTER_PATH = "serve_app.serving.routing.router:TokenLoadRouter"
"""The router's own module, not its package: Serve pickles the module it names by value, and a package by value
would give each process's router copies of ``routing.reports``' settings that the process cannot set."""


def gpus_per_replica(config: DeploymentConfig) -> float:
    """``auto``: one GPU per replica when the Ray cluster has GPUs, none otherwise (or with the simulated engine)."""
    if config.gpus_per_replica != "auto":
        return config.gpus_per_replica
    if getattr(config, "engine", None) == "simulated":
        return 0
    import ray

    if not ray.is_initialized():
        return 0
    return 1 if ray.cluster_resources().get("GPU", 0) > 0 else 0


def placement(config: Any) -> dict[str, Any]:
    """A replica's placement group: one bundle per engine worker, the replica's own CPUs added to the first, where
    Serve starts the replica (as Ray Serve LLM merges them); none without ``placement``."""
    settings = getattr(config, "placement", None)
    if settings is None:
        return {}
    workers = config.parallelism() if settings.workers == "auto" else settings.workers
    bundles = [dict(settings.bundle_per_worker) for _ in range(workers)]
    bundles[0]["CPU"] = bundles[0].get("CPU", 0) + config.cpus_per_replica
    return {"placement_group_bundles": bundles, "placement_group_strategy": settings.strategy}


def deployment_options(config: DeploymentConfig) -> dict[str, Any]:
    """``Deployment.options(**...)`` for ``config``."""
    scaling = config.autoscaling
    group = placement(config)
    gpus = 0 if group else gpus_per_replica(config)  # in a placement group the engine's workers hold the GPUs
    policy = (
        {"policy": {"policy_function": POLICY_PATH, "policy_kwargs": {"target_tokens": scaling.target_tokens}}}
        if scaling.metric == "tokens"
        else {}
    )
    options = {
        "ray_actor_options": {"num_cpus": config.cpus_per_replica, "num_gpus": gpus},
        **group,
        "max_ongoing_requests": config.max_ongoing_requests,
        "max_queued_requests": config.max_queued_requests,
        "backpressure_config": {"status_code": 503, "retry_after_s": RETRY_AFTER_S},
        "autoscaling_config": {
            "min_replicas": scaling.min_replicas,
            "initial_replicas": max(1, scaling.min_replicas),
            "max_replicas": scaling.max_replicas,
            "target_ongoing_requests": scaling.target_ongoing_requests,
            "upscale_delay_s": scaling.upscale_delay_s,
            "downscale_delay_s": scaling.downscale_delay_s,
            "look_back_period_s": scaling.look_back_period_s,
            "metrics_interval_s": scaling.metrics_interval_s,
            **policy,
        },
        "graceful_shutdown_timeout_s": config.graceful_shutdown_timeout_s,
        "graceful_shutdown_wait_loop_s": 0.5,
        "health_check_period_s": 5.0,
        "health_check_timeout_s": 30.0,
    }
    if getattr(config, "routes_by_tokens", False):
        routing = config.routing  # type: ignore[attr-defined]
        options["request_router_config"] = {
            "request_router_class": ROUTER_PATH,
            "request_router_kwargs": {
                "stale_after_s": routing.stale_after_s,
                "default_max_tokens": config.sampling.max_tokens,  # type: ignore[attr-defined]
                "prefix_weight": routing.prefix_weight,
                "prefix_max_share": routing.prefix_max_share,
                "adapter_weight": routing.adapter_weight,
                "base_model": config.model_name,  # type: ignore[attr-defined]
                "session_affinity": routing.session_affinity,
            },
            "request_routing_stats_period_s": routing.stats_period_s,
        }
    return options
