"""``POST /generate``: the seeds' endpoint, ``{"prompts": [...], "task_id": ...}`` plus sampling, answered with the
texts in input order (``results``) and each prompt's details."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, Field

from .common import OriginFields, SamplingFields, clamp_logprob
from .types import Text


class GenerateRequest(SamplingFields, OriginFields):
    """``POST /generate``'s body: the seeds' fields, sampling, and the request's priority and tenant (``user``)."""

    prompts: list[Text] = Field(..., description="one or more prompts, answered in order")
    task_id: Text | None = Field(None, max_length=256)


class GeneratedLogprob(BaseModel):
    """A generated token's log probability (minus infinity sent as -9999.0) and its alternatives' as ``[text,
    logprob]`` pairs, in vLLM's order (the token itself first)."""

    token: str
    logprob: Annotated[float, AfterValidator(clamp_logprob)]
    top: list[tuple[str, Annotated[float, AfterValidator(clamp_logprob)]]]


class PromptResult(BaseModel):
    """One prompt's outcome; ``logprobs`` where the request asked for them."""

    text: str
    prompt_tokens: int
    output_tokens: int
    finish_reason: str
    error: str | None = None
    logprobs: list[GeneratedLogprob] | None = None


class GenerateResponse(BaseModel):
    """``results`` holds the texts in input order (the seeds' shape); ``details`` the rest."""

    task_id: str | None
    results: list[str]
    details: list[PromptResult]
