"""The application builder that ``serve_config.yaml`` imports (``import_path: serve_app.app:build_app``).

``args`` are validated as :class:`~serve_app.config.AppConfig` here, before any replica starts, so a bad
value fails ``serve run`` at once with pydantic's message naming the field.
"""

from __future__ import annotations

import logging
from typing import Any

from ray.serve import Application

from .autoscaling import POLICY_PATH
from .config import AppConfig
from .http_errors import RETRY_AFTER_S
from .server import LLMServer

logger = logging.getLogger("serve_app")


def gpus_per_replica(config: Any) -> float:
    """``auto``: one GPU per replica when the Ray cluster has GPUs, none otherwise."""
    if config.gpus_per_replica != "auto":
        return config.gpus_per_replica
    if config.engine == "simulated":
        return 0
    import ray

    if not ray.is_initialized():
        return 0
    return 1 if ray.cluster_resources().get("GPU", 0) > 0 else 0


def deployment_options(config: Any) -> dict[str, Any]:
    """The Serve deployment options a config implies (resources, autoscaling, limits): the generation
    app's :class:`AppConfig` or the embedding app's config, which share these fields."""
    scaling = config.autoscaling
    return {
        "ray_actor_options": {"num_cpus": config.cpus_per_replica, "num_gpus": gpus_per_replica(config)},
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
            **autoscaling_policy(scaling),
        },
        "graceful_shutdown_timeout_s": config.graceful_shutdown_timeout_s,
        "graceful_shutdown_wait_loop_s": 0.5,
        "health_check_period_s": 5.0,
        "health_check_timeout_s": 30.0,
    }


def autoscaling_policy(scaling: Any) -> dict[str, Any]:
    """``metric: tokens``: the token-aware policy (:mod:`serve_app.autoscaling`); Serve's own otherwise."""
    if scaling.metric != "tokens":
        return {}
    return {"policy": {"policy_function": POLICY_PATH, "policy_kwargs": {"target_tokens": scaling.target_tokens}}}


def build_app(args: dict[str, Any] | None = None) -> Application:
    """Build the Serve application from ``args`` (see :class:`~serve_app.config.AppConfig`)."""
    config = AppConfig.model_validate(args or {})
    options = deployment_options(config)
    logger.info("building %s app for %s with %s", config.engine, config.model_name, options)
    return LLMServer.options(**options).bind(config.model_dump())
