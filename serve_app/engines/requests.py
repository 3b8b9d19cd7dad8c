"""What an engine is asked: one prompt, tokenized (:class:`GenerationRequest`), with its sampling, already validated
(:class:`SamplingOptions`, :class:`StructuredOutputs`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

__all__ = ["GenerationRequest", "SamplingOptions", "StructuredOutputs"]


@dataclass(frozen=True)
class StructuredOutputs:
    """A constraint the output must match (vLLM's structured outputs), exactly one of: a JSON schema (as JSON
    text), any JSON object, a regular expression, one of a list of choices, an EBNF/Lark grammar, or a structural
    tag (xgrammar's, as JSON text: how vLLM's tool parsers force a call in the model's own format)."""

    json: str | None = None
    json_object: bool | None = None
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    structural_tag: str | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None


@dataclass(frozen=True)
class SamplingOptions:
    """Per-request sampling, already validated: OpenAI's fields and vLLM's extensions, with vLLM's defaults."""

    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    top_k: int = 0
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    ignore_eos: bool = False
    logit_bias: tuple[tuple[int, float], ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logprobs: int | None = None
    """Log probabilities of each generated token and of this many alternatives (0: the token's own); None: none."""
    prompt_logprobs: int | None = None
    """The same for each prompt token (what OpenAI's completions ``echo`` with ``logprobs`` returns)."""
    structured_outputs: StructuredOutputs | None = None
    """A constraint the output must match (``response_format``, vLLM's ``structured_outputs``); None: free text."""
    allowed_token_ids: tuple[int, ...] | None = None
    """The only tokens it may generate (vLLM's extension); None: any."""
    bad_words: tuple[str, ...] = ()
    """Words it may not generate, at a word's start or inside one (vLLM's extension)."""
    adapter: str | None = None
    """The LoRA adapter the request runs with (its name in ``lora.adapters``); None: the base model."""
    truncate_prompt_tokens: int | None = None
    """Keep this many of the prompt's tokens (-1: the model's context), as vLLM's renderer truncates; None: all."""
    truncation_side: str | None = None
    """``left`` keeps the last tokens, ``right`` the first; None: the engine's tokenizer's side."""
    cache_salt: str | None = None
    """Mixed into the keys of its prompt's cached blocks (vLLM's extension): it reuses, and its blocks serve, only
    requests of the same salt, so one tenant's prompts cannot be read from another's timing."""
    stream_interval: int | None = None
    """Its outputs come this many tokens at a time, the first token and the end at once (vLLM's extension); None:
    each token as it comes."""
    repetition_detection: tuple[int, int, int] | None = None
    """It ends where its last tokens repeat a pattern of ``(max, min)`` tokens ``count`` times (vLLM's extension,
    ``(max_pattern_size, min_pattern_size, min_count)``; its finish reason ``repetition``); None: never."""


@dataclass
class GenerationRequest:
    """One prompt, tokenized, with its sampling and a unique request id (for aborts); its ``priority`` (vLLM's
    meaning: lower runs first) and ``tenant`` (whose share it counts against) order it in the batcher."""

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingOptions
    prompt_text: str = ""
    priority: int = 0
    tenant: str | None = None
    submitted_at: float = field(default_factory=time.monotonic)
    """When it passed validation (``time.monotonic``): the start of its queue wait."""
    reasoning_ended: bool | None = None
    """True: its structured output constrains from the first generated token, not after a reasoning model's
    thoughts (vLLM's ``reasoning_ended``: a chat request with ``include_reasoning: false``); None: the engine's
    reasoning parser decides."""

    def estimate_tokens(self) -> int:
        """Its KV-cache footprint at the end: the prompt plus every token it may generate (its cost)."""
        return len(self.prompt_token_ids) + self.sampling.max_tokens

    def estimate_growth(self) -> int:
        """Tokens it may add while it runs (the continuous batcher's peak estimate)."""
        return self.sampling.max_tokens

    def prefix_blocks(self, size: int) -> list[int]:
        """The keys of its prompt's full blocks of ``size`` tokens, each a hash of the block and the key before
        it, under its adapter and cache salt (as vLLM's prefix cache keys KV blocks): the continuous batcher's
        ``prefix_fn``."""
        ids, key, keys = self.prompt_token_ids, hash((self.sampling.adapter, self.sampling.cache_salt)), []
        for start in range(0, len(ids) - size + 1, size):
            key = hash((key, *ids[start : start + size]))
            keys.append(key)
        return keys
