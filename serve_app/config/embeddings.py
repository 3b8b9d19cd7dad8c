"""The embedding application's configuration (its ``args`` in ``serve_config.yaml``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from ..models import BUNDLED_ENCODER_NAME
from .batcher import BatchSettings
from .common import DeploymentConfig, merge_defaults

BATCHER_DEFAULTS: dict[str, Any] = {
    "target_batch_tokens": "auto",
    "max_batch_size": 256,
    "batch_timeout_s": 0.005,
    "max_concurrent_batches": 1,
    "order": "length_aware",
    "max_queue_size": 8_192,
}
"""The embedding batcher's own defaults (an encoder pads every batch to its longest input, so batches are cut
by length; ``auto``: 1024 padded tokens on a CPU, where small length-sorted batches waste least, and 16384 on a
GPU, TEI's default, as a GPU needs large batches to fill)."""

CPU_BATCH_TOKENS = 1_024
GPU_BATCH_TOKENS = 16_384


class EmbeddingConfig(DeploymentConfig):
    """The embedding application: ``args`` for ``serve_app.app:build_embeddings_app``. Its batcher is batch mode
    with a budget of padded tokens (batch size x longest input), and defaults of its own (``BATCHER_DEFAULTS``)."""

    BUNDLED_NAME = BUNDLED_ENCODER_NAME

    device: str = Field("auto", description="`auto`: the replica's GPU when it has one, else the CPU; or cpu, cuda")
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        "auto", description="`auto`: float32 on a CPU, float16 on a GPU"
    )
    cpu_threads: Literal["auto"] | int = Field("auto", description="CPU compute threads; `auto`: every usable core")
    max_inputs_per_request: int = Field(2_048, ge=1, description="inputs in one request (OpenAI's limit is 2048)")
    max_input_chars: int = Field(100_000, ge=1, description="the longest input text accepted, before tokenizing")
    batcher: BatchSettings = Field(default_factory=lambda: BatchSettings(**BATCHER_DEFAULTS))

    @model_validator(mode="before")
    @classmethod
    def _batcher_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict) and "batcher" in data:
            data = {**data, "batcher": merge_defaults(BATCHER_DEFAULTS, data["batcher"])}
        return data

    def batch_tokens(self, device: str) -> int:
        """What ``target_batch_tokens: auto`` means on ``device``."""
        return CPU_BATCH_TOKENS if device == "cpu" else GPU_BATCH_TOKENS
