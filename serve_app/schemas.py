"""HTTP request bodies (pydantic): ``/generate`` in the seeds' shape, and OpenAI's ``/v1/completions`` and
``/v1/chat/completions`` with OpenAI's whole request schema plus vLLM's sampling extensions.

Every field OpenAI documents for these endpoints is accepted; what vLLM honours is honoured; a field set to
something this server cannot honour (beam search, tools, structured output, logprobs, audio, ...) is refused
with a 400 naming it (:meth:`OpenAIRequest.refusals`), never silently ignored. Unknown fields get a 422.

These are written here rather than imported from ``vllm.entrypoints.openai``: vLLM's protocol modules import
torch and vLLM's engine configuration, which the simulated engine (and a Ray Serve install without vLLM)
must not need. Responses use the ``openai`` package's own models (:mod:`serve_app.openai_format`).
"""

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

TokenId = Annotated[int, Field(ge=0, lt=2**31)]


class SamplingFields(BaseModel):
    """Per-request sampling; a field left out takes the app's default (``max_tokens``, ``temperature``,
    ``top_p``, ``stop``, ``seed``) or vLLM's."""

    model_config = ConfigDict(extra="forbid")

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
    include_stop_str_in_output: bool | None = None

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

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key in value or {}:
            if not key.isdigit() or int(key) >= 2**31:
                raise ValueError(f"logit_bias keys must be token ids (non-negative integers), got {key!r}")
        return value


class GenerateRequest(SamplingFields):
    """``POST /generate``: the seeds' body, ``{"prompts": [...], "task_id": ...}``, plus sampling."""

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


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool | None = None
    include_obfuscation: bool | None = None
    continuous_usage_stats: bool | None = None  # vLLM's


class OpenAIRequest(SamplingFields):
    """Fields both OpenAI generation endpoints share."""

    model: Text | None = None
    n: int = Field(1, ge=1, le=16)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: Text | None = None
    # vLLM's, accepted with its defaults only
    use_beam_search: bool = False
    length_penalty: float = 1.0
    priority: int = 0
    request_id: Text | None = None

    def refusals(self) -> list[tuple[str, str]]:
        """``(field, why)`` for each field set to something this server cannot honour."""
        out = []
        if self.use_beam_search:
            out.append(("use_beam_search", "beam search is not supported; use sampling"))
        if self.length_penalty != 1.0:
            out.append(("length_penalty", "length_penalty applies to beam search, which is not supported"))
        if self.priority != 0:
            out.append(("priority", "priority scheduling is not enabled on this server"))
        return out


class CompletionRequest(OpenAIRequest):
    """OpenAI ``POST /v1/completions``."""

    prompt: Text | list[Text] | list[TokenId] | list[list[TokenId]]
    best_of: int | None = Field(None, ge=1)
    echo: bool | None = False
    logprobs: int | None = Field(None, ge=0, le=20)
    suffix: Text | None = None

    def refusals(self) -> list[tuple[str, str]]:
        out = super().refusals()
        if self.best_of is not None and self.best_of > self.n:
            out.append(("best_of", "best_of above n is not supported"))
        if self.logprobs:
            out.append(("logprobs", "log probabilities are not returned by this server"))
        if self.suffix:
            out.append(("suffix", "suffix (insertion) is not supported"))
        return out


class ContentPart(BaseModel):
    """One part of a message's content; only text parts can be honoured by a text-only model."""

    model_config = ConfigDict(extra="allow")

    type: str
    text: Text | None = None


class ChatMessage(BaseModel):
    """A chat message; ``content`` as a string or a list of parts (OpenAI's two forms)."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[ContentPart] | None = None
    name: Text | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: Text | None = None
    refusal: Text | None = None

    def text(self) -> str:
        """The content as one string (text parts joined); other parts were refused in validation."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text or "" for part in self.content)


class ChatCompletionRequest(OpenAIRequest):
    """OpenAI ``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: Literal["none", "auto"] | dict[str, Any] | None = None
    metadata: dict[str, Text] | None = None
    store: bool | None = None
    service_tier: Text | None = None
    modalities: list[Literal["text", "audio"]] | None = None
    audio: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    reasoning_effort: Text | None = None
    web_search_options: dict[str, Any] | None = None
    verbosity: Text | None = None
    prompt_cache_key: Text | None = None
    safety_identifier: Text | None = None
    # vLLM's chat extensions
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None

    def refusals(self) -> list[tuple[str, str]]:
        out = super().refusals()
        if self.logprobs or self.top_logprobs:
            out.append(("logprobs" if self.logprobs else "top_logprobs", "log probabilities are not returned"))
        if self.response_format and self.response_format.get("type") != "text":
            out.append(("response_format", "only response_format type 'text' is supported (no structured output)"))
        if self.tools or self.functions:
            out.append(("tools" if self.tools else "functions", "tool calling is not supported by this server"))
        if self.tool_choice not in (None, "none", "auto") or self.function_call not in (None, "none", "auto"):
            out.append(("tool_choice", "tool calling is not supported by this server"))
        if (self.modalities and "audio" in self.modalities) or self.audio:
            out.append(("audio", "audio output is not supported"))
        if self.prediction:
            out.append(("prediction", "predicted outputs are not supported"))
        if self.web_search_options:
            out.append(("web_search_options", "web search is not supported"))
        if not self.add_generation_prompt or self.continue_final_message or self.chat_template_kwargs:
            out.append(("chat_template_kwargs", "only the default chat template call is supported"))
        for i, message in enumerate(self.messages):
            for j, part in enumerate(message.content if isinstance(message.content, list) else ()):
                if part.type != "text" or part.text is None:
                    out.append((f"messages[{i}].content[{j}]", f"content part type '{part.type}' is not supported"))
            if message.tool_calls:
                out.append((f"messages[{i}].tool_calls", "tool calling is not supported by this server"))
        return out
