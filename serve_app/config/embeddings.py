"""The embedding application's configuration (its ``args`` in ``serve_config.yaml``): which engine embeds
(``vllm``: vLLM's pooling runner, every input packed into one varlen batch, behind continuous admission;
``padded``: sentence-transformers in torch, padded batches cut by length), and each engine's batcher defaults."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from ..models import BUNDLED_ENCODER_NAME
from .batcher import BatcherSettings
from .common import AutoOrCount, AutoOrPositive, DeploymentConfig, merge_defaults
from .generation import VLLMSettings

PADDED_DEFAULTS: dict[str, Any] = {
    "mode": "batch",
    "target_batch_tokens": "auto",
    "max_batch_size": 256,
    "batch_timeout_s": 0.005,
    "max_concurrent_batches": 1,
    "order": "length_aware",
    "max_queue_size": 8_192,
}
"""The padded engine's batcher defaults (an encoder pads every batch to its longest input, so batches are cut by
length; ``auto``: 1024 padded tokens on a CPU, where small length-sorted batches waste least, and 16384 on a GPU,
TEI's default, as a GPU needs large batches to fill)."""

VLLM_DEFAULTS: dict[str, Any] = {
    "mode": "continuous",
    "max_inflight_tokens": "auto",
    "max_inflight": "auto",
    "order": "fifo",
    "max_queue_size": 8_192,
}
"""The vLLM engine's batcher defaults: continuous admission, each input entering vLLM as soon as its tokens fit
the in-flight budget (``auto``: two of vLLM's scheduler steps, ``max_num_batched_tokens`` each, so the next step
is always ready while one runs) and leaving it the moment its vector is out. In arrival order: vLLM pads nothing,
so shortest-first saves no padding, and it scatters a list's inputs over time while its request waits for the
last (docs/embeddings.md has the measurement)."""

BATCHER_DEFAULTS = {"vllm": VLLM_DEFAULTS, "padded": PADDED_DEFAULTS}

CPU_BATCH_TOKENS = 1_024
GPU_BATCH_TOKENS = 16_384
CPU_BATCH_OVERHEAD_TOKENS = 128
"""``batch_overhead_tokens: auto`` for the padded encoder on a CPU: what a batch costs whatever its size, in
tokens (the encoder's own cost per batch plus the batcher's and the replica's work for it; chosen by measurement,
docs/embeddings.md). On a GPU not measured: 0, the budget alone cuts."""


class PoolingSettings(VLLMSettings):
    """vLLM's engine for embeddings (``AsyncEngineArgs`` with ``runner: pooling``); ``engine_args`` passes anything
    else through."""

    max_model_len: int | None = Field(  # type: ignore[assignment]
        None, ge=16, description="the longest input; default: the model's own (all-MiniLM-L6-v2: 256)"
    )
    dtype: str = Field(
        "auto",
        description="`auto`: on a CPU bfloat16 where it multiplies bfloat16 in hardware (AMX: Intel Xeon from Sapphire "
        "Rapids on, 1.9x the texts/s; AVX512-BF16: AMD from Zen 4 on, 1.4x; vectors at cosine >= 0.9998 to "
        "float32's), float32 elsewhere; on a GPU vLLM's own (float16 for a float32 model)",
    )
    cpu_kvcache_space_gb: float = Field(
        1,
        gt=0,
        description="CPU-only hosts: the KV cache's memory in GiB (vLLM's kv_cache_memory_bytes); "
        "VLLM_CPU_KVCACHE_SPACE, where set in the environment, wins",
    )
    cpu_replica_niceness: int = Field(
        0,
        ge=0,
        le=19,
        description="CPU-only hosts: once its engine is up, the process holding it (tokenizing, HTTP, encoding "
        "vectors: a large share of an embedding's work) runs at this niceness; 0 leaves it as it started",
    )
    cpu_reserved_cores: int | None = Field(
        0,
        ge=0,
        description="CPU-only hosts: cores vLLM keeps off its compute threads (VLLM_CPU_NUM_OF_RESERVED_CPU; vLLM's "
        "own default, None, keeps one, half of a 2-core host); 0: every core computes, as the embeddings benchmark "
        "runs vLLM's own server",
    )
    cpu_spin_count: AutoOrCount | None = Field(
        None,
        description="CPU-only hosts: GOMP_SPINCOUNT of the engine's compute threads; null: libgomp's own (300,000). "
        "An embedding load runs step after step with no one waiting on a first token (2 cores, 64 clients: the app "
        "within its run-to-run noise either way, vLLM's own server 5-10% faster with libgomp's own); `auto`: 1,000 "
        "where no core is reserved, as for generation",
    )
    scheduling_policy: Literal["priority", "fcfs"] = Field(
        "fcfs", description="vLLM's scheduler (the batcher already admits inputs in its own order)"
    )
    max_num_batched_tokens: AutoOrPositive | None = Field(
        None,
        description="tokens in one of vLLM's steps; null: vLLM's own (2048 on a CPU): an encoder's input is never "
        "chunked, and the in-flight budget is two such steps; `auto`: 512 on a CPU, as the generation engine's",
    )


class EmbeddingConfig(DeploymentConfig):
    """The embedding application: ``args`` for ``serve_app.app:build_embeddings_app``. Its batcher's defaults are
    the engine's own (``VLLM_DEFAULTS``: continuous admission; ``PADDED_DEFAULTS``: batches under a budget of padded
    tokens, batch size x longest input)."""

    BUNDLED_NAME = BUNDLED_ENCODER_NAME

    engine: Literal["vllm", "padded"] = Field(
        "vllm",
        description="`vllm`: vLLM's pooling runner packs every input into one batch without padding (BERT-like "
        "sentence-transformers models it supports, the bundled one included). `padded`: sentence-transformers in "
        "torch, padded batches cut by length, for models vLLM cannot run",
    )
    device: str = Field(
        "auto", description="engine `padded`: `auto` (the replica's GPU when it has one, else the CPU), cpu, cuda"
    )
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        "auto",
        description="engine `padded`: `auto` is bfloat16 on a CPU with AMX or AVX512-BF16, float32 on other CPUs, "
        "float16 on a GPU (vLLM: `vllm.dtype`)",
    )
    cpu_threads: Literal["auto"] | int = Field(
        "auto", description="engine `padded`: CPU compute threads; `auto`: every usable core (vLLM: `vllm.cpu_threads`)"
    )
    max_inputs_per_request: int = Field(2_048, ge=1, description="inputs in one request (OpenAI's limit is 2048)")
    max_input_chars: int = Field(100_000, ge=1, description="the longest input text accepted, before tokenizing")
    batcher: BatcherSettings = Field(default_factory=lambda: EmbeddingConfig.default_batcher("vllm"))
    vllm: PoolingSettings = Field(default_factory=PoolingSettings)

    @staticmethod
    def default_batcher(engine: str) -> dict[str, Any]:
        """The batcher an engine gets when ``batcher`` is left out."""
        return dict(BATCHER_DEFAULTS.get(engine, VLLM_DEFAULTS))

    @model_validator(mode="before")
    @classmethod
    def _batcher_defaults(cls, data: Any) -> Any:
        """Fill the batcher from the engine's defaults (those of the mode given, when one is)."""
        if not isinstance(data, dict):
            return data
        engine = data.get("engine", "vllm")
        given = data.get("batcher")
        if given is None:
            return {**data, "batcher": cls.default_batcher(engine)}
        if isinstance(given, dict):
            mode = given.get("mode", BATCHER_DEFAULTS.get(engine, VLLM_DEFAULTS)["mode"])
            defaults = VLLM_DEFAULTS if mode == "continuous" else PADDED_DEFAULTS
            return {**data, "batcher": merge_defaults(defaults, given)}
        return data

    @model_validator(mode="after")
    def _padded_batches(self) -> EmbeddingConfig:
        if self.engine == "padded" and self.batcher.mode != "batch":
            raise ValueError(
                "batcher.mode: the padded engine runs whole padded batches, so it needs `mode: batch` "
                "(continuous admission is for engine `vllm`)"
            )
        return self

    def batch_tokens(self, device: str) -> int:
        """What ``target_batch_tokens: auto`` means for a padded engine on ``device``."""
        return CPU_BATCH_TOKENS if device == "cpu" else GPU_BATCH_TOKENS

    def batch_overhead(self, device: str) -> int:
        """What ``batch_overhead_tokens: auto`` means for a padded engine on ``device``."""
        return CPU_BATCH_OVERHEAD_TOKENS if device == "cpu" else 0
