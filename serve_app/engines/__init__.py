"""Generation engines behind one interface (:class:`Engine`): ``vllm`` (AsyncLLM) and ``simulated``. Embedding engines
have their own small interface (:mod:`.embedding`): ``vllm`` (vLLM's pooling runner) and ``padded``."""

from __future__ import annotations

from ..config import AppConfig
from ..models import resolve
from .base import (
    Engine,
    EngineDeadError,
    GenerationDelta,
    GenerationOutput,
    GenerationRequest,
    GenerationResult,
    SamplingOptions,
    StructuredOutputs,
    TokenLogprob,
    coalesce,
    progress,
)

__all__ = [
    "Engine",
    "EngineDeadError",
    "GenerationDelta",
    "GenerationOutput",
    "GenerationRequest",
    "GenerationResult",
    "SamplingOptions",
    "StructuredOutputs",
    "TokenLogprob",
    "build_engine",
    "coalesce",
    "progress",
]


def build_engine(config: AppConfig) -> Engine:
    """The engine the config selects (``vllm`` is imported only when chosen)."""
    if config.engine == "simulated":
        from .parsers import OutputParsers
        from .simulated import SimulatedEngine

        adapters = config.lora.max_loaded if config.lora is not None else 1
        if not config.simulated.tokenizer:
            return SimulatedEngine(config.simulated, max_adapters=adapters)
        parsers = OutputParsers(
            config.vllm.tool_call_parser, config.vllm.reasoning_parser, config.vllm.tool_strict_level
        )
        return SimulatedEngine(config.simulated, resolve(config.model), parsers, adapters)
    from .vllm_engine import VLLMEngine

    on_gpus = config.placement is not None and config.placement.bundle_per_worker.get("GPU", 0) > 0
    return VLLMEngine(
        resolve(config.model), config.vllm, workers_on_gpus=on_gpus, lora=config.lora, served_name=config.model_name
    )
