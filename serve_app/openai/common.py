"""What the endpoints share: the sampling fields (OpenAI's and vLLM's extensions), the
fields both OpenAI generation endpoints have, and token usage (Server-Sent Events: :mod:`.sse`)."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from contextvars import ContextVar
from typing import Annotated, Any, Literal

from fastapi import Depends, Header
from openai.types import CompletionUsage
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from ..engines import GenerationResult, StructuredOutputs
from .fields import OpenAIModel
from .structured import ResponseFormat, StructuredOutputsFields
from .types import Priority, Refusal, Text, TokenId


class RepetitionDetection(BaseModel):
    """vLLM's ``repetition_detection``: an output ends once its last tokens repeat a pattern of ``min_pattern_size``
    (0: 1) to ``max_pattern_size`` tokens ``min_count`` times (vLLM checks the three together)."""

    model_config = ConfigDict(extra="forbid")

    max_pattern_size: int = Field(0, ge=0)
    min_pattern_size: int = Field(0, ge=0)
    min_count: int = Field(0, ge=0)


class SamplingFields(BaseModel):
    """Per-request sampling; a field left out takes the app's default (``max_tokens``, ``temperature``,
    ``top_p``, ``stop``, ``seed``) or vLLM's."""

    model_config = ConfigDict(extra="forbid")

    model: Text | None = Field(None, description="the served model's name, or a LoRA adapter's (`lora.adapters`)")
    max_tokens: int | None = Field(None, ge=1, description="new tokens per prompt")
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stop: Text | list[Text] | None = None
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = None
    # vLLM's sampling extensions
    top_k: int | None = Field(None, ge=-1, description="0 or -1: off")
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=2.0)
    min_tokens: int | None = Field(None, ge=0)
    ignore_eos: bool | None = None
    stop_token_ids: list[TokenId] | None = Field(None, max_length=64)
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = Field(
        None, description="put a space between special tokens in the text (where they are not skipped)"
    )
    include_stop_str_in_output: bool | None = None
    structured_outputs: StructuredOutputsFields | None = None
    allowed_token_ids: list[TokenId] | None = Field(None, description="the only tokens the model may generate")
    bad_words: list[Text] | None = Field(None, description="words the model may not generate")
    truncate_prompt_tokens: int | None = Field(
        None, ge=-1, description="keep this many of the prompt's tokens (-1: the model's context)"
    )
    truncation_side: Literal["left", "right"] | None = Field(
        None, description="keep the last (left) or first (right) tokens; default: the tokenizer's side"
    )
    cache_salt: Text | None = Field(
        None, min_length=1, description="prompts share prefix-cache blocks only with prompts of the same salt"
    )
    stream_interval: int | None = Field(
        None, ge=1, description="a stream's chunks carry this many tokens (its first token and its end go at once)"
    )
    repetition_detection: RepetitionDetection | None = Field(
        None, description="end the output where its last tokens repeat a pattern (stop reason `repetition_detected`)"
    )
    logprobs: int | None = Field(
        None, ge=0, le=20, description="log probability of each generated token, with this many alternatives"
    )
    prompt_logprobs: int | None = Field(
        None,
        ge=-1,
        description="vLLM's: each prompt token's log probability, with this many alternatives (-1: the whole "
        "vocabulary, within the engine's max_logprobs); not in an HTTP stream",
    )

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, value: str | list[str] | None) -> list[str] | None:
        stops = [value] if isinstance(value, str) else value
        if stops is not None:
            if len(stops) > 16:
                raise ValueError("at most 16 stop strings")
            if any(not s for s in stops):
                raise ValueError("stop strings must not be empty")
        return stops

    @field_validator("bad_words")
    @classmethod
    def _bad_words(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and any(not word.strip() for word in value):
            raise ValueError("bad words must not be empty")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key in value or {}:
            if not key.isdigit() or int(key) >= 2**31:
                raise ValueError(f"logit_bias keys must be token ids (non-negative integers), got {key!r}")
        return value

    def refusals(self) -> list[Refusal]:
        """Fields set to something this server cannot honour (none here; the endpoints add theirs)."""
        return []

    def logprob_counts(self) -> tuple[int | None, int | None]:
        """How many alternatives to return with each generated token's log probability, and with each prompt
        token's (None: no log probabilities): ``logprobs`` and ``prompt_logprobs``; the OpenAI endpoints say theirs."""
        return self.logprobs, self.prompt_logprobs

    def output_constraint(self) -> StructuredOutputs | None:
        """What the output must match (``structured_outputs``); None: free text."""
        return self.structured_outputs.constraint() if self.structured_outputs is not None else None

    def constraint_field(self) -> str:
        """The body's field that sets :meth:`output_constraint` (what a refusal of it names)."""
        return "structured_outputs"


class Origin(BaseModel):
    """Who a request comes from, as the batcher orders it: its ``priority`` (lower runs first) and its ``tenant``
    (whose fair share it counts against: the OpenAI ``user``, a Ray Data job's id)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    priority: Priority = 0
    tenant: Text | None = Field(None, max_length=256)


async def api_key_tenant(authorization: str | None = Header(None)) -> str | None:
    """The tenant of an HTTP request's API key (``Authorization: Bearer <key>``): ``key-`` and 16 hex digits of the
    key's SHA-256, so the key itself never reaches the statistics or the logs; None without a key. ``async``, so
    FastAPI calls it on the event loop: a plain ``def`` dependency runs in a worker thread, a hop per request."""
    scheme, _, key = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        return None
    return "key-" + hashlib.sha256(key.strip().encode()).hexdigest()[:16]


KeyTenant = Annotated[str | None, Depends(api_key_tenant)]
"""An HTTP route's parameter: the request's API key as a tenant (:func:`api_key_tenant`)."""


JOB_ORIGIN: ContextVar[Origin | None] = ContextVar("job_origin", default=None)
"""Set while a replica answers a batch job's OpenAI body through its own HTTP app (``Replica.openai``): the
priority and tenant of a body that names neither, so the job's lines run as a job (the body itself, which the
route echoes in its answers, is left as it was)."""


class OriginFields(BaseModel):
    """The body fields that say who a request comes from: OpenAI's ``user`` (its tenant) and vLLM's ``priority``;
    over HTTP, a request without ``user`` counts against its API key (:meth:`sent_with`)."""

    user: Text | None = Field(None, max_length=256)
    priority: Priority = 0
    _key_tenant: str | None = PrivateAttr(None)

    def sent_with(self, key_tenant: str | None) -> None:
        """The request came with this API key's tenant (:data:`KeyTenant`): its tenant when it names no ``user``."""
        self._key_tenant = key_tenant

    @property
    def origin(self) -> Origin:
        """Its priority and, as its tenant, its ``user``; what it does not name comes from the batch job sending it
        (:data:`JOB_ORIGIN`), else the default priority and its API key's tenant."""
        job = JOB_ORIGIN.get()
        priority = self.priority if job is None or "priority" in self.model_fields_set else job.priority
        tenant = self.user if self.user is not None else job.tenant if job is not None else self._key_tenant
        return Origin(priority=priority, tenant=tenant)


class StreamOptions(OpenAIModel):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None
    continuous_usage_stats: bool | None = None  # vLLM's


class OpenAIRequest(SamplingFields, OriginFields, OpenAIModel):
    """Fields both OpenAI generation endpoints share; a field neither OpenAI nor vLLM defines is ignored
    (:class:`~serve_app.openai.fields.OpenAIModel`), unlike ``/generate``'s."""

    model_config = ConfigDict(extra="ignore")

    n: int = Field(1, ge=1, le=16)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    # vLLM's, accepted with its defaults only
    use_beam_search: bool = False
    length_penalty: float = 1.0
    request_id: Text | None = None
    response_format: ResponseFormat | None = None
    return_token_ids: bool | None = Field(
        None, description="vLLM's: the prompt's token ids and each choice's generated ones (a stream's: per chunk)"
    )
    return_tokens_as_token_ids: bool | None = Field(
        None, description="vLLM's: each log probability's token, and its alternatives, named `token_id:<id>`"
    )

    def refusals(self) -> list[Refusal]:
        out = super().refusals() + self.extension_refusals()
        if self.response_format is not None and self.response_format.type == "structural_tag":
            out.append(("response_format", "type 'structural_tag' is not supported; use json_schema"))
        elif self.response_format is not None and self.response_format.type != "text" and self.structured_outputs:
            out.append(("response_format", "set response_format or structured_outputs, not both"))
        if self.use_beam_search:
            out.append(("use_beam_search", "beam search is not supported; use sampling"))
        if self.length_penalty != 1.0:
            out.append(("length_penalty", "length_penalty applies to beam search, which is not supported"))
        if self.stream_options is not None and not self.stream:
            out.append(("stream_options", "only allowed with stream=true"))
        if self.stream and self.prompt_logprobs is not None and self.prompt_logprobs != 0:
            out.append(("prompt_logprobs", "prompt_logprobs are not available when stream=true"))
        return out

    def output_constraint(self) -> StructuredOutputs | None:
        """``response_format``'s constraint, else ``structured_outputs``'s."""
        constraint = self.response_format.constraint() if self.response_format is not None else None
        return constraint or super().output_constraint()

    def constraint_field(self) -> str:
        has_format = self.response_format is not None and self.response_format.type != "text"
        return "response_format" if has_format else super().constraint_field()

    @property
    def include_usage(self) -> bool:
        """Whether a stream ends with a usage chunk."""
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """Whether each chunk of a stream carries its choice's usage so far (vLLM's ``continuous_usage_stats``,
        which takes ``include_usage`` too)."""
        return self.include_usage and bool(self.stream_options and self.stream_options.continuous_usage_stats)


def new_id(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex}"


def stamp_usage(chunks: Sequence[Any], prompt_tokens: int, completion_tokens: int) -> None:
    """vLLM's ``continuous_usage_stats``: each of one choice's ``chunks`` carries that choice's usage so far (a chat's
    role chunk with none of its completion yet, as vLLM's server sends it)."""
    for chunk in chunks:
        choice = chunk.choices[0] if chunk.choices else None  # a chat choice's delta; a completion's has none
        delta = choice.delta if choice is not None and "delta" in type(choice).model_fields else None
        done = 0 if delta is not None and delta.role and not delta.content else completion_tokens
        chunk.usage = CompletionUsage(
            prompt_tokens=prompt_tokens, completion_tokens=done, total_tokens=prompt_tokens + done
        )


def usage(results: Sequence[GenerationResult], n: int = 1, reasoning: int | None = None) -> CompletionUsage:
    """Token usage: each prompt counted once (every ``n``-th result), every completion counted; ``reasoning``: how
    many of the completions' tokens were thoughts, where a reasoning parser read them; how many prompt tokens the
    engine's prefix cache held, where it keeps one (as OpenAI's API reports them; vLLM's server with
    ``--enable-prompt-tokens-details``)."""
    prompts = results[::n]
    prompt = sum(r.prompt_tokens for r in prompts)
    completion = sum(r.output_tokens for r in results)
    details: dict[str, Any] = {}
    if reasoning is not None:
        details["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    if prompts and all(r.cached_tokens is not None for r in prompts):
        details["prompt_tokens_details"] = {"cached_tokens": sum(r.cached_tokens or 0 for r in prompts)}
    return CompletionUsage(
        prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion, **details
    )
