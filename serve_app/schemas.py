"""HTTP request and response bodies (pydantic): ``/generate`` in the seeds' shape, and OpenAI's
``/v1/completions`` and ``/v1/chat/completions`` (non-streaming)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator


def is_valid_unicode(text: str) -> bool:
    """Whether ``text`` encodes to UTF-8: JSON's ``\\ud800`` escapes decode to lone surrogates, which no
    tokenizer and no JSON response can carry."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _valid_unicode(value: str) -> str:
    if not is_valid_unicode(value):
        raise ValueError("not valid Unicode: holds a lone surrogate (such as '\\ud800')")
    return value


Text = Annotated[str, AfterValidator(_valid_unicode)]
"""A string that encodes to UTF-8 (JSON lets a client send lone surrogates; nothing downstream takes them)."""


class SamplingFields(BaseModel):
    """Per-request sampling; a field left out takes the app's default."""

    max_tokens: int | None = Field(None, ge=1, description="new tokens per prompt")
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stop: Text | list[Text] | None = None
    seed: int | None = Field(None, ge=0, le=2**63 - 1)

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


class GenerateRequest(SamplingFields):
    """``POST /generate``: the seeds' body, ``{"prompts": [...], "task_id": ...}``, plus sampling."""

    model_config = ConfigDict(extra="forbid")

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


class CompletionRequest(SamplingFields):
    """OpenAI ``POST /v1/completions`` (the fields this server honours; others are refused)."""

    model_config = ConfigDict(extra="forbid")

    model: Text | None = None
    prompt: Text | list[Text]
    n: Literal[1] = 1
    stream: Literal[False] = False
    user: Text | None = None


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: Text


class ChatCompletionRequest(SamplingFields):
    """OpenAI ``POST /v1/chat/completions`` (non-streaming)."""

    model_config = ConfigDict(extra="forbid")

    model: Text | None = None
    messages: list[ChatMessage] = Field(..., min_length=1)
    n: Literal[1] = 1
    stream: Literal[False] = False
    user: Text | None = None
    max_completion_tokens: int | None = Field(None, ge=1)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


def usage_of(results: list[Any]) -> Usage:
    """Token usage summed over results."""
    prompt = sum(r.prompt_tokens for r in results)
    completion = sum(r.output_tokens for r in results)
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
