"""The embedding application's configuration (its ``args`` in ``serve_config.yaml``), validated by pydantic
when the app is built, so a bad value fails ``serve run`` at once with a message naming the field."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from ..config import AutoOrPositive, AutoscalingSettings, ServerConfig, _Strict
from ..engines.encoder import BUNDLED_ENCODER, BUNDLED_ENCODER_NAME

CPU_BATCH_TOKENS = 1_024
GPU_BATCH_TOKENS = 16_384


class EmbeddingBatcherSettings(_Strict):
    """Batch mode for a padded encoder: a batch costs its size x its longest input (padded tokens), and
    length-aware cutting groups inputs of similar length so little of that is padding."""

    target_batch_tokens: AutoOrPositive = Field(
        "auto",
        description="padded tokens per batch (batch size x longest input); auto: 1024 on a CPU (measured: the "
        "encoder's time grows with padded tokens, so small, length-sorted batches waste least), 16384 on a GPU "
        "(TEI's default max-batch-tokens: a GPU needs large batches to fill)",
    )
    max_batch_size: int = Field(256, ge=1)
    batch_timeout_s: float = Field(0.005, ge=0.0, le=60.0, description="longest wait for a batch to fill")
    max_concurrent_batches: int = Field(1, ge=1, description="batches inside the encoder at once")
    length_aware: bool = Field(True, description="cut batches of similar length (off: strict FIFO)")
    max_queue_size: int = Field(8_192, ge=1, description="inputs waiting before new requests get 503")

    def batcher_kwargs(self, device: str = "cpu") -> dict[str, Any]:
        """Keyword arguments for :class:`batching.TokenBatcher` on ``device`` (where ``auto`` resolves)."""
        budget = self.target_batch_tokens
        if budget == "auto":
            budget = CPU_BATCH_TOKENS if device == "cpu" else GPU_BATCH_TOKENS
        return {**self.model_dump(), "target_batch_tokens": budget, "padded": True}


class EmbeddingConfig(ServerConfig):
    """Everything the embedding app needs; ``serve_config.yaml``'s embedding ``args`` are this model (with
    the generation app's ``api_key`` and ``max_request_body_bytes``)."""

    engine: ClassVar[str] = "encoder"

    model: str = Field(BUNDLED_ENCODER, min_length=1, description="'bundled', a local folder or a hub model id")
    served_model_name: str | None = Field(None, description="name in OpenAI responses; default: model")
    device: str = Field("auto", description="auto: the GPU when the replica has one, else the CPU; or cpu, cuda")
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    cpu_threads: Literal["auto"] | int = Field("auto", description="CPU compute threads; auto: every usable core")
    gpus_per_replica: Literal["auto"] | float = Field("auto", description="'auto': 1 when the cluster has GPUs")
    cpus_per_replica: float = Field(0.5, gt=0)
    max_inputs_per_request: int = Field(2_048, ge=1, description="OpenAI's limit is 2048 inputs per request")
    max_input_chars: int = Field(100_000, ge=1, description="longest input text accepted, before tokenizing")
    max_ongoing_requests: int = Field(4_096, ge=1, description="per replica; the batcher queues, not Serve")
    max_queued_requests: int = Field(-1, ge=-1)
    graceful_shutdown_timeout_s: float = Field(60.0, ge=0)
    request_timeout_s: float = Field(300.0, gt=0)
    batcher: EmbeddingBatcherSettings = Field(default_factory=EmbeddingBatcherSettings)
    autoscaling: AutoscalingSettings = Field(default_factory=AutoscalingSettings)

    @property
    def model_name(self) -> str:
        """The name clients see in responses (``bundled`` shows as the bundled model's name)."""
        if self.served_model_name:
            return self.served_model_name
        return BUNDLED_ENCODER_NAME if self.model == BUNDLED_ENCODER else self.model
