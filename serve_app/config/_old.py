"""The application's configuration (the ``args`` of ``serve_config.yaml``), validated by pydantic when the
app is built, so a bad value fails ``serve run`` at once with a message naming the field."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from .models import BUNDLED, BUNDLED_NAME

AutoOrPositive = Literal["auto"] | Annotated[int, Field(ge=1)]
"""A size the app works out itself (``auto``) or an integer >= 1."""

AUTO_FALLBACK_TOKENS = 65_536
"""The ``auto`` in-flight budget when an engine cannot say how large its KV cache is."""

AUTO_FALLBACK_INFLIGHT = 256
"""The ``auto`` in-flight request cap when an engine cannot say how many requests it runs at once."""


API_KEY_ENV = "SERVE_APP_API_KEY"
"""The environment variable holding the API key when ``api_key`` is not in the config (as vLLM's
``VLLM_API_KEY``); read in the replica's process."""

DEFAULT_MAX_REQUEST_BODY_BYTES = 16 * 1024 * 1024

_SENDABLE_KEY = re.compile(r"[\x21-\x7e]+")


def check_api_key(key: str, source: str) -> str:
    """``key`` if an HTTP client can send it in ``Authorization: Bearer <key>``: visible ASCII, no spaces."""
    if not _SENDABLE_KEY.fullmatch(key):
        raise ValueError(f"{source}: an API key must be visible ASCII characters with no spaces")
    return key


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ServerConfig(_Strict):
    """What every HTTP app of the project shares: its door (``serve_app/door.py``), the API key and the
    request-body limit. ``AppConfig`` and other apps' configs inherit it."""

    api_key: SecretStr | None = Field(
        None,
        min_length=1,
        description=f"clients must send 'Authorization: Bearer <key>' (all routes but /health, /healthz); "
        f"default: the {API_KEY_ENV} environment variable of the replica's process, else no key. "
        "The config wins over the variable; prefer the variable, to keep the key out of YAML",
    )
    max_request_body_bytes: int = Field(
        DEFAULT_MAX_REQUEST_BODY_BYTES,
        ge=1024,
        description="HTTP bodies larger than this get 413 before they are read or parsed (a JSON body costs "
        "several times its size in memory once parsed). 16 MiB holds a full request of the default limits "
        "several times over: 256 prompts filling a 2048-token context are about 2 MiB as text, 3-4 MiB as "
        "token ids or \\u-escaped non-ASCII text, and one prompt of max_prompt_chars (200 000) at most 1.2 MB. "
        "It does not hold 256 prompts of max_prompt_chars each (50+ MB): raise it with the context length, or "
        "send such batches through the DeploymentHandle or Ray Data, which it does not limit",
    )

    @field_validator("api_key")
    @classmethod
    def _sendable(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            check_api_key(value.get_secret_value(), "api_key")
        return value

    def effective_api_key(self, environ: Mapping[str, str] | None = None) -> SecretStr | None:
        """The key clients must send: ``api_key`` if set, else the ``SERVE_APP_API_KEY`` environment variable
        (read now: call it in the replica), else None (no key). An empty variable counts as unset."""
        if self.api_key is not None:
            return self.api_key
        value = (os.environ if environ is None else environ).get(API_KEY_ENV, "")
        return SecretStr(check_api_key(value, API_KEY_ENV)) if value else None


class SamplingDefaults(_Strict):
    """Sampling used when a request leaves a field out."""

    max_tokens: int = Field(128, ge=1, description="new tokens per prompt")
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stop: list[str] | None = None
    seed: int | None = None


class BatcherSettings(_Strict):
    """The replica's batcher; live-reconfigurable through ``user_config``.

    ``continuous`` (the default, for engines that batch continuously such as vLLM): each request enters the
    engine as soon as its tokens (prompt + max_tokens) fit the in-flight budget, and gives them back when it
    alone finishes; its output streams as it comes. ``batch``: budgeted batches for static-batch engines.
    """

    mode: Literal["continuous", "batch"] = "continuous"
    max_queue_size: int = Field(4_096, ge=1, description="requests' prompts waiting before new ones get 503")
    # continuous mode
    max_inflight_tokens: AutoOrPositive = Field(
        "auto", description="token budget in flight (prompt + max_tokens each); auto: the engine's KV cache size"
    )
    max_inflight: AutoOrPositive = Field(
        "auto", description="most requests inside the engine at once; auto: as many as it runs at once"
    )
    order: Literal["fifo", "length_aware"] = "fifo"
    max_wait_s: float = Field(2.0, ge=0.0, description="length_aware: a request waiting this long goes next")
    peak_estimate: bool = Field(False, description="admit on LightLLM's peak KV estimate instead of final sizes")
    max_queue_wait_s: float | None = Field(
        None, gt=0, description="503 at once for a request expected to wait longer than this for admission"
    )
    # batch mode
    target_batch_tokens: int = Field(
        32_768, ge=1, description="token budget of a batch: prompt tokens + max_tokens of each request"
    )
    max_batch_size: int = Field(64, ge=1)
    batch_timeout_s: float = Field(0.01, ge=0.0, le=60.0)
    max_concurrent_batches: int = Field(2, ge=1, description="batches inside the engine at once")
    length_aware: bool = False
    isolate_failures: bool = False

    def batcher_kwargs(self, kv_cache_tokens: int | None = None, max_running: int | None = None) -> dict[str, Any]:
        """Keyword arguments for the mode's batcher (``TokenBatcher`` or ``ContinuousBatcher``); the engine's
        KV cache size and running-request cap size the ``auto`` settings (fallbacks where it cannot say)."""
        if self.mode == "batch":
            return self.model_dump(
                include={
                    "max_queue_size",
                    "target_batch_tokens",
                    "max_batch_size",
                    "batch_timeout_s",
                    "max_concurrent_batches",
                    "length_aware",
                    "isolate_failures",
                }
            )
        budget = self.max_inflight_tokens
        if budget == "auto":
            budget = kv_cache_tokens or AUTO_FALLBACK_TOKENS
        inflight = self.max_inflight
        if inflight == "auto":
            inflight = max_running or AUTO_FALLBACK_INFLIGHT
        return {
            "max_inflight_cost": budget,
            "max_inflight": inflight,
            "max_queue_size": self.max_queue_size,
            "order": self.order,
            "max_wait_s": self.max_wait_s,
            "peak_estimate": self.peak_estimate,
            "max_queue_wait_s": self.max_queue_wait_s,
        }

    @model_validator(mode="after")
    def _queue_holds_a_batch(self) -> BatcherSettings:
        if self.mode == "batch" and self.max_queue_size < self.max_batch_size:
            raise ValueError(
                f"batcher.max_queue_size ({self.max_queue_size}) must be >= batcher.max_batch_size "
                f"({self.max_batch_size}), or batches can never fill"
            )
        return self


class VLLMSettings(_Strict):
    """vLLM engine options (``AsyncEngineArgs``); ``engine_args`` passes anything else through."""

    max_model_len: int = Field(2_048, ge=16)
    dtype: str = "auto"
    enforce_eager: bool | None = Field(None, description="default: True on CPU, False on GPU")
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0)
    cpu_kvcache_space_gb: int = Field(2, ge=1, description="VLLM_CPU_KVCACHE_SPACE on CPU-only hosts")
    cpu_threads: Literal["auto"] | int = Field(
        "auto", description="CPU-only hosts: the engine's compute threads (OMP_NUM_THREADS); auto: every usable core"
    )
    cpu_replica_niceness: int = Field(
        19,
        ge=0,
        le=19,
        description="CPU-only hosts: once its engine is up, the process holding it (a replica or a Ray Data actor: "
        "HTTP, streaming, detokenizing) runs at this niceness, so the engine's compute on the same cores goes "
        "first; 0 leaves it as it started",
    )
    max_num_seqs: int | None = Field(None, ge=1)
    engine_args: dict[str, Any] = Field(default_factory=dict)


class SimulatedSettings(_Strict):
    """The simulated engine (no model): deterministic text, time from a cost model.

    Continuous (default): each step advances every running sequence by one token and takes ``step_s +
    step_s_per_seq * sequences + step_s_per_token * context tokens + prefill_s_per_token * new prompt
    tokens``. ``padded``: a static batch engine; a batch takes ``batch_overhead_s`` + prefill over batch
    size x the longest prompt + ``step_s`` per step of the longest output + ``step_s_per_seq`` per sequence
    and step.
    """

    max_model_len: int = Field(2_048, ge=16)
    batch_overhead_s: float = Field(0.0, ge=0.0)
    prefill_s_per_token: float = Field(0.0, ge=0.0)
    step_s: float = Field(0.0, ge=0.0)
    step_s_per_seq: float = Field(0.0, ge=0.0)
    step_s_per_token: float = Field(0.0, ge=0.0)
    max_num_seqs: int = Field(256, ge=1, description="sequences running at once (vLLM's max_num_seqs)")
    kv_cache_tokens: int = Field(65_536, ge=1, description="the simulated KV cache (sizes an auto budget)")
    padded: bool = False
    fail_marker: str | None = Field(
        "__simulated_fail__", description="a prompt containing it fails (testing the error paths)"
    )
    die_marker: str | None = Field(
        "__simulated_die__", description="a prompt containing it kills the engine (testing health checks)"
    )
    raise_marker: str | None = Field(
        "__simulated_raise__", description="a batch holding it raises after running (testing failure isolation)"
    )


class AutoscalingSettings(_Strict):
    """Replica autoscaling (Ray Serve's ``autoscaling_config``).

    ``metric: requests`` (default) is Serve's own policy: replicas = ongoing requests / ``target_ongoing_requests``.
    ``metric: tokens`` is :class:`serve_app.autoscaling.TokenAutoscalingPolicy`: replicas = the token cost the
    replicas hold (queued + in flight, prompt + max_tokens each) / ``target_tokens``; ``target_tokens`` left
    out is each replica's in-flight token budget (its engine's KV cache with ``max_inflight_tokens: auto``).
    """

    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(2, ge=1)
    metric: Literal["requests", "tokens"] = Field("requests", description="what a replica's load is measured in")
    target_ongoing_requests: float = Field(32, gt=0, description="metric requests: ongoing requests per replica")
    target_tokens: int | None = Field(
        None, ge=1, description="metric tokens: token cost held per replica; default: its in-flight token budget"
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
        if self.target_tokens is not None and self.metric != "tokens":
            raise ValueError("autoscaling.target_tokens applies only with autoscaling.metric: tokens")
        if self.look_back_period_s <= self.metrics_interval_s:
            raise ValueError(
                f"autoscaling.look_back_period_s ({self.look_back_period_s}) must be > "
                f"autoscaling.metrics_interval_s ({self.metrics_interval_s}): the window needs several reports"
            )
        return self


class AppConfig(ServerConfig):
    """Everything the app needs; ``serve_config.yaml``'s ``args`` are this model."""

    engine: Literal["vllm", "simulated"] = "vllm"
    model: str = Field(BUNDLED, min_length=1, description="'bundled', a local folder or a hub model id")
    served_model_name: str | None = Field(None, description="name in OpenAI responses; default: model")
    embeddings_app: str | None = Field(
        None, description="the Serve app serving /v1/embeddings beside this one; /v1/models lists its model too"
    )
    gpus_per_replica: Literal["auto"] | int = Field("auto", description="'auto': 1 when the cluster has GPUs, else 0")
    cpus_per_replica: float = Field(1.0, gt=0)
    max_prompts_per_request: int = Field(256, ge=1)
    max_tokens_limit: int = Field(1_024, ge=1, description="largest max_tokens a request may ask for")
    max_prompt_chars: int = Field(200_000, ge=1, description="longest prompt text accepted, before tokenizing")
    max_ongoing_requests: int = Field(
        4_096,
        ge=1,
        description="per replica; >= the batch size so batches fill, and best as large as the batcher's queue: "
        "the batcher queues by tokens and sheds load with 503 + Retry-After, while Serve's own queue stalls "
        "once replicas are saturated",
    )
    max_queued_requests: int = Field(
        -1, ge=-1, description="per caller (HTTP proxy, handle) waiting for a replica; beyond: 503. -1: no cap"
    )
    graceful_shutdown_timeout_s: float = Field(60.0, ge=0)
    request_timeout_s: float = Field(600.0, gt=0)
    sampling: SamplingDefaults = Field(default_factory=SamplingDefaults)
    batcher: BatcherSettings = Field(default_factory=BatcherSettings)
    autoscaling: AutoscalingSettings = Field(default_factory=AutoscalingSettings)
    vllm: VLLMSettings = Field(default_factory=VLLMSettings)
    simulated: SimulatedSettings = Field(default_factory=SimulatedSettings)

    @field_validator("gpus_per_replica")
    @classmethod
    def _non_negative(cls, value: str | int) -> str | int:
        if isinstance(value, int) and value < 0:
            raise ValueError("gpus_per_replica must be 'auto' or an integer >= 0")
        return value

    @model_validator(mode="after")
    def _batches_can_fill(self) -> AppConfig:
        # Ray Serve caps a replica's concurrent requests at max_ongoing_requests; below the batch size,
        # single-prompt requests could never fill a batch (Ray only warns about this; we refuse).
        field, needed = (
            ("batcher.max_batch_size", self.batcher.max_batch_size)
            if self.batcher.mode == "batch"
            else ("batcher.max_inflight", self.batcher.max_inflight)
        )
        if needed == "auto":  # the engine's own cap, known once it is up (the replica logs it)
            needed = 0
        if self.max_ongoing_requests < needed:
            raise ValueError(
                f"max_ongoing_requests ({self.max_ongoing_requests}) must be >= {field} ({needed}), "
                "or the engine can never be filled"
            )
        if self.sampling.max_tokens > self.max_tokens_limit:
            raise ValueError(
                f"sampling.max_tokens ({self.sampling.max_tokens}) must be <= max_tokens_limit "
                f"({self.max_tokens_limit})"
            )
        if self.autoscaling.target_ongoing_requests > self.max_ongoing_requests:
            raise ValueError(
                f"autoscaling.target_ongoing_requests ({self.autoscaling.target_ongoing_requests}) must be "
                f"<= max_ongoing_requests ({self.max_ongoing_requests})"
            )
        return self

    @property
    def max_model_len(self) -> int:
        """The context length of the selected engine."""
        return self.vllm.max_model_len if self.engine == "vllm" else self.simulated.max_model_len

    @property
    def model_name(self) -> str:
        """The name clients see in responses (``bundled`` shows as the bundled model's name)."""
        if self.served_model_name:
            return self.served_model_name
        return BUNDLED_NAME if self.model == BUNDLED else self.model
