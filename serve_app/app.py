"""The application builder that ``serve_config.yaml`` imports (``import_path: serve_app.app:build_app``).

``args`` are validated as :class:`~serve_app.config.AppConfig` here, before any replica starts, so a bad
value fails ``serve run`` at once with pydantic's message naming the field.
"""

from __future__ import annotations

import logging
from typing import Any

from ray.serve import Application

from .config import AppConfig
from .server import RETRY_AFTER_S, LLMServer

logger = logging.getLogger("serve_app")


def gpus_per_replica(config: AppConfig) -> int:
    """``auto``: one GPU per replica when the Ray cluster has GPUs, none otherwise."""
    if config.gpus_per_replica != "auto":
        return int(config.gpus_per_replica)
    if config.engine == "simulated":
        return 0
    import ray

    if not ray.is_initialized():
        return 0
    return 1 if ray.cluster_resources().get("GPU", 0) > 0 else 0


def deployment_options(config: AppConfig) -> dict[str, Any]:
    """The Serve deployment options the config implies (resources, autoscaling, limits)."""
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
        },
        "graceful_shutdown_timeout_s": config.graceful_shutdown_timeout_s,
        "graceful_shutdown_wait_loop_s": 0.5,
        "health_check_period_s": 5.0,
        "health_check_timeout_s": 30.0,
    }


def build_app(args: dict[str, Any] | None = None) -> Application:
    """Build the Serve application from ``args`` (see :class:`~serve_app.config.AppConfig`)."""
    config = AppConfig.model_validate(args or {})
    options = deployment_options(config)
    logger.info("building %s app for %s with %s", config.engine, config.model_name, options)
    return LLMServer.options(**options).bind(config.model_dump())
