"""``POST /generate``: the seeds' endpoint, ``{"prompts": [...], "task_id": ...}`` plus sampling, answered with the
texts in input order (``results``) and each prompt's details."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, Field

from .common import OriginFields, SamplingFields
from .logprobs import clamp_logprob
from .types import Text


class GenerateRequest(SamplingFields, OriginFields):
    """``POST /generate``'s body: the seeds' fields, sampling, and the request's priority and tenant (``user``)."""

    prompts: list[Text] = Field(..., description="one or more prompts, answered in order")
    task_id: Text | None = Field(None, max_length=256)


Logprob = Annotated[float, AfterValidator(clamp_logprob)]


class GeneratedLogprob(BaseModel):
    """A generated token's log probability (minus infinity sent as -9999.0), its id, and its alternatives' as
    ``[text, logprob]`` pairs, in vLLM's order (the token itself first)."""

    token: str
    logprob: Logprob
    top: list[tuple[str, Logprob]]
    token_id: int | None = None


class PromptLogprob(GeneratedLogprob):
    """A prompt token's: the same, with no log probability for the first token (nothing precedes it)."""

    logprob: Logprob | None  # type: ignore[assignment]


class PromptResult(BaseModel):
    """One prompt's outcome; ``logprobs`` and ``prompt_logprobs`` where the request asked for them."""

    text: str
    prompt_tokens: int
    output_tokens: int
    finish_reason: str
    error: str | None = None
    logprobs: list[GeneratedLogprob] | None = None
    prompt_logprobs: list[PromptLogprob] | None = None


class GenerateResponse(BaseModel):
    """``results`` holds the texts in input order (the seeds' shape); ``details`` the rest."""

    task_id: str | None
    results: list[str]
    details: list[PromptResult]
