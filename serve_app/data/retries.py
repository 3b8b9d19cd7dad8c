"""How a job's handle calls survive a replica's failure: which failures are worth a retry, and the retry loop
(backoff, a timeout on every call) that :mod:`serve_app.data.jobs` and the OpenAI Batch files share."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from ..errors import classify

logger = logging.getLogger(__name__)

T = TypeVar("T")


def retryable(exc: BaseException) -> bool:
    """Whether a handle call's failure may succeed on retry: what the error table retries, a timeout, and Ray's
    and Serve's own signs of a replica gone, restarting or overloaded."""
    from ray import exceptions as ray_exceptions
    from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

    cause = getattr(exc, "cause", None) or exc
    ray_transient = (
        ray_exceptions.RayActorError,
        ray_exceptions.ActorUnavailableError,
        ray_exceptions.ObjectLostError,
        BackPressureError,
        DeploymentUnavailableError,
        TimeoutError,
    )
    return classify(cause).retry or isinstance(cause, ray_transient) or isinstance(exc, ray_transient)


@dataclass(frozen=True)
class Retries:
    """How a job's handle calls are retried: at most ``max_retries`` times, with exponential backoff from
    ``backoff_s`` (jittered), each call given ``timeout_s`` (then it counts as retryable)."""

    max_retries: int = 6
    backoff_s: float = 0.5
    timeout_s: float = 600.0

    async def call(self, send: Callable[[], Awaitable[T]], again: Callable[[T], bool] = lambda _: False) -> T:
        """``send()``'s answer, sent again while it fails retryably or ``again(answer)`` says the answer asks for
        it; once the retries are spent, the last answer, or the last failure raised."""
        for attempt in range(self.max_retries + 1):
            last = attempt == self.max_retries
            try:
                answer = await asyncio.wait_for(send(), timeout=self.timeout_s)
            except Exception as exc:
                if last or not retryable(exc):
                    raise
                why = type(exc).__name__
            else:
                if last or not again(answer):
                    return answer
                why = "a retryable answer"
            delay = self.backoff_s * 2**attempt * (0.5 + random.random())
            logger.info("retryable failure (%s); retry %d in %.1f s", why, attempt + 1, delay)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover
