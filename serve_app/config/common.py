"""What both applications' configurations share: the deployment's options (resources, limits, draining,
autoscaling), the HTTP door (API key, body limit) and the model's name. ``AppConfig`` (generation) and
``EmbeddingConfig`` (embeddings) inherit it, so each shared setting is declared, and described, once."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from ..models import BUNDLED

AutoOrPositive = Literal["auto"] | Annotated[int, Field(ge=1)]
"""A size the app works out itself (``auto``) or an integer >= 1."""

AutoOrCount = Literal["auto"] | Annotated[int, Field(ge=0)]
"""A count the app works out itself (``auto``) or an integer >= 0."""


PROJECT = Path(__file__).resolve().parents[2]
"""The project's folder (where serve_config.yaml is): what a relative path in the configuration starts from."""


def _project_file(value: str) -> str:
    path = (PROJECT / Path(value).expanduser()).resolve()
    if not path.is_file():
        raise ValueError(f"no such file: {path}")
    return str(path)


ProjectFile = Annotated[str, AfterValidator(_project_file)]
"""A file that exists, as an absolute path; a relative one is taken from the project's folder (:data:`PROJECT`),
wherever Serve builds the app or starts a replica."""

API_KEY_ENV = "SERVE_APP_API_KEY"
"""The environment variable holding the API key when ``api_key`` is not in the config (as vLLM's
``VLLM_API_KEY``); read in the replica's process."""

DEFAULT_MAX_REQUEST_BODY_BYTES = 16 * 1024 * 1024

DATA_PRIORITY = 1
"""A Ray Data job's default priority: after interactive HTTP and handle calls (0), which replicas admit first
(vLLM's meaning: lower runs first)."""

_SENDABLE_KEY = re.compile(r"[\x21-\x7e]+")


def check_api_key(key: str, source: str) -> str:
    """``key`` if an HTTP client can send it in ``Authorization: Bearer <key>``: visible ASCII, no spaces."""
    if not _SENDABLE_KEY.fullmatch(key):
        raise ValueError(f"{source}: an API key must be visible ASCII characters with no spaces")
    return key


class Strict(BaseModel):
    """A settings model: unknown keys are errors (a typo fails ``serve run`` naming it), assignments validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class AutoscalingSettings(Strict):
    """Replica autoscaling (Ray Serve's ``autoscaling_config``). ``metric: requests`` is Serve's own policy;
    ``metric: tokens`` is the token-aware one (``serve_app.serving.autoscaling``)."""

    min_replicas: int = Field(1, ge=0, description="fewest replicas")
    max_replicas: int = Field(2, ge=1, description="most replicas (on a GPU cluster: up to the number of GPUs)")
    metric: Literal["requests", "tokens"] = Field(
        "requests",
        description="what a replica's load is measured in. `requests`: Serve's policy, replicas = ongoing requests "
        "/ `target_ongoing_requests`. `tokens`: replicas = the token cost the replicas hold (queued + in flight, "
        "prompt + max_tokens each) / `target_tokens`, for mixes of long multi-prompt requests and short chats",
    )
    target_ongoing_requests: float = Field(
        32,
        gt=0,
        description="metric `requests`: ongoing requests per replica. Best at the engine's running cap "
        "(`batcher.max_inflight`: vLLM's max_num_seqs, 128 on a CPU, 1024 on an H100), so a replica scales out "
        "once requests queue in its batcher",
    )
    target_tokens: int | None = Field(
        None,
        ge=1,
        description="metric `tokens`: token cost held per replica; default: each replica's in-flight token budget "
        "(its engine's KV cache with `max_inflight_tokens: auto`)",
    )
    max_priority: int | None = Field(
        None,
        description="metric `tokens`: only the tokens of requests of this priority or a higher one (a smaller "
        "number) count; 0 keeps Ray Data jobs (priority 1) from scaling the fleet out: they run in what interactive "
        "traffic leaves. Default: every priority",
    )
    upscale_delay_s: float = Field(5.0, ge=0, description="how long the load must call for more replicas")
    downscale_delay_s: float = Field(120.0, ge=0, description="how long the load must call for fewer replicas")
    look_back_period_s: float = Field(10.0, gt=0, description="the window Serve averages the load over (Serve: 30)")
    metrics_interval_s: float = Field(
        2.0, gt=0, description="how often replicas and callers report their load (Serve: 10; deprecated but live)"
    )

    @model_validator(mode="after")
    def _ordered(self) -> AutoscalingSettings:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"autoscaling.min_replicas ({self.min_replicas}) must be <= "
                f"autoscaling.max_replicas ({self.max_replicas})"
            )
        for field in ("target_tokens", "max_priority"):
            if getattr(self, field) is not None and self.metric != "tokens":
                raise ValueError(f"autoscaling.{field} applies only with autoscaling.metric: tokens")
        if self.look_back_period_s <= self.metrics_interval_s:
            raise ValueError(
                f"autoscaling.look_back_period_s ({self.look_back_period_s}) must be > "
                f"autoscaling.metrics_interval_s ({self.metrics_interval_s}): the window needs several reports"
            )
        return self


class DeploymentConfig(Strict):
    """The settings every application of the project has: its model's name, the Serve deployment's options
    and the HTTP door (``serve_app/serving/door.py``)."""

    BUNDLED_NAME: ClassVar[str] = ""
    """What ``model: bundled`` shows as (each application's bundled model)."""

    model: str = Field(BUNDLED, min_length=1, description="`bundled`, a local folder or a hub model id")
    served_model_name: str | None = Field(None, description="the name in OpenAI responses; default: the model's")
    gpus_per_replica: Literal["auto"] | float = Field(
        "auto", description="`auto`: 1 when the Ray cluster has GPUs, else 0; a fraction lets small models share one"
    )
    cpus_per_replica: float = Field(
        1.0, ge=0, description="Ray's logical CPUs per replica; 0: it takes none from what Ray Data jobs count on"
    )
    max_ongoing_requests: int = Field(
        4_096,
        ge=1,
        description="requests one replica holds at once; >= the engine's batch so it can fill, and best as large as "
        "the batcher's queue: the batcher queues by tokens and sheds load with 503 + Retry-After, while Serve's "
        "own queue stalls once replicas are saturated",
    )
    max_queued_requests: int = Field(
        -1,
        ge=-1,
        description="requests each caller (HTTP proxy, handle) queues for a busy deployment; beyond: 503. -1: no cap",
    )
    graceful_shutdown_timeout_s: float = Field(
        60.0, ge=0, description="how long a stopping replica drains what its batcher holds"
    )
    request_timeout_s: float = Field(600.0, gt=0, description="a request still running after this gets 504")
    autoscaling: AutoscalingSettings = Field(default_factory=AutoscalingSettings)
    api_key: SecretStr | None = Field(
        None,
        min_length=1,
        description=f"HTTP clients must send `Authorization: Bearer <key>` (401 otherwise; /health and /healthz "
        f"stay open); default: the {API_KEY_ENV} environment variable of the replica's process, else no key. "
        "Prefer the variable, to keep the key out of YAML",
    )
    max_request_body_bytes: int = Field(
        DEFAULT_MAX_REQUEST_BODY_BYTES,
        ge=1024,
        description="HTTP bodies larger than this get 413 before they are read. 16 MiB holds 256 prompts filling a "
        "2048-token context several times over; raise it with the context, or send such batches through the "
        "DeploymentHandle or Ray Data, which it does not limit",
    )

    @field_validator("api_key")
    @classmethod
    def _sendable(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            check_api_key(value.get_secret_value(), "api_key")
        return value

    @field_validator("gpus_per_replica")
    @classmethod
    def _non_negative(cls, value: str | float) -> str | float:
        if not isinstance(value, str) and value < 0:
            raise ValueError("gpus_per_replica must be 'auto' or a number >= 0")
        return value

    @model_validator(mode="after")
    def _target_fits(self) -> DeploymentConfig:
        if self.autoscaling.target_ongoing_requests > self.max_ongoing_requests:
            raise ValueError(
                f"autoscaling.target_ongoing_requests ({self.autoscaling.target_ongoing_requests}) must be "
                f"<= max_ongoing_requests ({self.max_ongoing_requests})"
            )
        return self

    @property
    def model_name(self) -> str:
        """The name clients see in responses (``bundled`` shows as the bundled model's name)."""
        if self.served_model_name:
            return self.served_model_name
        return self.BUNDLED_NAME if self.model == BUNDLED else self.model

    def effective_api_key(self, environ: Mapping[str, str] | None = None) -> SecretStr | None:
        """The key clients must send: ``api_key`` if set, else the ``SERVE_APP_API_KEY`` environment variable
        (read now: call it in the replica), else None (no key). An empty variable counts as unset."""
        if self.api_key is not None:
            return self.api_key
        value = (os.environ if environ is None else environ).get(API_KEY_ENV, "")
        return SecretStr(check_api_key(value, API_KEY_ENV)) if value else None


def merge_defaults(defaults: Mapping[str, Any], given: Any) -> Any:
    """``given`` (a dict of settings) over ``defaults``; anything else (a model, None) as it is."""
    return {**defaults, **given} if isinstance(given, Mapping) else given
