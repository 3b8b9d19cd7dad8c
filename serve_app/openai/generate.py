"""``POST /generate``: the seeds' endpoint, ``{"prompts": [...], "task_id": ...}`` plus sampling, answered with the
texts in input order (``results``) and each prompt's details."""

from __future__ import annotations

from pydantic import BaseModel, Field

from .common import OriginFields, SamplingFields
from .types import Text


class GenerateRequest(SamplingFields, OriginFields):
    """``POST /generate``'s body: the seeds' fields, sampling, and the request's priority and tenant (``user``)."""

    prompts: list[Text] = Field(..., description="one or more prompts, answered in order")
    task_id: Text | None = Field(None, max_length=256)


class PromptResult(BaseModel):
    """One prompt's outcome."""

    text: str
    prompt_tokens: int
    output_tokens: int
    finish_reason: str
    error: str | None = None


class GenerateResponse(BaseModel):
    """``results`` holds the texts in input order (the seeds' shape); ``details`` the rest."""

    task_id: str | None
    results: list[str]
    details: list[PromptResult]
