"""``POST /v1/chat/completions``: OpenAI's request (plus vLLM's chat extensions), what of it is refused, and its
response body and stream chunks."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessage, ChatCompletionTokenLogprob
from openai.types.chat.chat_completion import Choice as ChatChoice
from openai.types.chat.chat_completion import ChoiceLogprobs
from openai.types.chat.chat_completion_chunk import Choice as ChunkChoice
from openai.types.chat.chat_completion_chunk import ChoiceDelta
from openai.types.chat.chat_completion_chunk import ChoiceLogprobs as ChunkLogprobs
from openai.types.chat.chat_completion_token_logprob import TopLogprob
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..engines import GenerationDelta, GenerationResult, TokenLogprob
from .common import OpenAIRequest, clamp_logprob, new_id, usage
from .completions import finish_reason
from .fields import GENERATION_EXTENSIONS, OpenAIModel
from .types import Refusal, Text


class ContentPart(BaseModel):
    """One part of a message's content; only text parts can be honoured by a text-only model."""

    model_config = ConfigDict(extra="allow")

    type: str
    text: Text | None = None


class ChatMessage(OpenAIModel):
    """A chat message; ``content`` as a string or a list of parts (OpenAI's two forms)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[ContentPart] | None = None
    name: Text | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: Text | None = None
    refusal: Text | None = None

    def text(self) -> str:
        """The content as one string (text parts joined); other parts are refused."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text or "" for part in self.content)


def message_refusals(messages: Sequence[ChatMessage]) -> list[Refusal]:
    """What in chat messages a text-only model cannot take: a content part other than text, tool calls."""
    out = []
    for i, message in enumerate(messages):
        for j, part in enumerate(message.content if isinstance(message.content, list) else ()):
            if part.type != "text" or part.text is None:
                out.append((f"messages[{i}].content[{j}]", f"content part type '{part.type}' is not supported"))
        if message.tool_calls:
            out.append((f"messages[{i}].tool_calls", "tool calling is not supported by this server"))
    return out


class ChatCompletionRequest(OpenAIRequest):
    """OpenAI ``POST /v1/chat/completions``; ``max_completion_tokens`` is ``max_tokens`` under its newer name."""

    VLLM_EXTENSIONS: ClassVar[Mapping[str, Any]] = {
        **GENERATION_EXTENSIONS,
        "add_special_tokens": False,
        "chat_template": None,
        "documents": None,
        "echo": False,
        "include_reasoning": True,
        "media_io_kwargs": None,
        "mm_processor_kwargs": None,
        "return_prompt_text": None,
    }

    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
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
    prompt_cache_options: dict[str, Any] | None = None
    prompt_cache_retention: Text | None = None
    moderation: dict[str, Any] | None = None
    safety_identifier: Text | None = None
    # vLLM's chat extensions
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _newer_name(self) -> ChatCompletionRequest:
        if self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        return self

    def refusals(self) -> list[Refusal]:
        out = super().refusals()
        if self.top_logprobs and not self.logprobs:
            out.append(("top_logprobs", "top_logprobs needs logprobs: true"))
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
        if self.moderation:
            out.append(("moderation", "moderation is not supported by this server"))
        if not self.add_generation_prompt or self.continue_final_message or self.chat_template_kwargs:
            out.append(("chat_template_kwargs", "only the default chat template call is supported"))
        return out + message_refusals(self.messages)

    def logprob_counts(self) -> tuple[int | None, int | None]:
        return ((self.top_logprobs or 0) if self.logprobs else None), None

    def conversation(self) -> list[dict[str, str]]:
        """The messages as ``{"role", "content"}`` dicts with text content, for the chat template."""
        return [{"role": m.role, "content": m.text()} for m in self.messages]


def _utf8(token: str) -> list[int]:
    return list(token.encode("utf-8", errors="replace"))


def token_logprobs(tokens: Sequence[TokenLogprob], top: int) -> list[ChatCompletionTokenLogprob]:
    """Chat's ``logprobs.content``: each token with its log probability and the first ``top`` alternatives the
    engine returned (vLLM's order)."""
    return [
        ChatCompletionTokenLogprob(
            token=t.token,
            bytes=_utf8(t.token),
            logprob=clamp_logprob(t.logprob),
            top_logprobs=[TopLogprob(token=k, bytes=_utf8(k), logprob=clamp_logprob(v)) for k, v in t.top[:top]],
        )
        for t in tokens
    ]


class ChatFormat:
    """``/v1/chat/completions`` bodies for one request with ``n`` choices; ``top_logprobs``: alternatives per
    token where the request asked for log probabilities (None: it did not); ``prompt_ids``: the conversation's
    token ids where it asked for token ids (vLLM's ``return_token_ids``; None: not)."""

    def __init__(
        self, model: str, n: int = 1, top_logprobs: int | None = None, prompt_ids: Sequence[int] | None = None
    ) -> None:
        self.model, self.n, self.top_logprobs = model, n, top_logprobs
        self.prompt_ids = None if prompt_ids is None else list(prompt_ids)
        self.id, self.created = new_id("chatcmpl"), int(time.time())
        self._started: set[int] = set()

    def _logprobs(self, tokens: Sequence[TokenLogprob] | None, kind: type[Any]) -> Any:
        if self.top_logprobs is None or tokens is None:
            return None
        return kind(content=token_logprobs(tokens, self.top_logprobs))

    def _token_ids(self, output: GenerationResult | GenerationDelta | None) -> dict[str, list[int]]:
        """A choice's generated token ids (a chunk's new ones) where the request asked for token ids."""
        return {} if self.prompt_ids is None else {"token_ids": list(output.token_ids if output else ())}

    def _prompt_ids(self) -> dict[str, list[int]]:
        """The conversation's token ids (the body's; a stream's role chunks') where the request asked for them."""
        return {} if self.prompt_ids is None else {"prompt_token_ids": self.prompt_ids}

    def response(self, results: Sequence[GenerationResult]) -> ChatCompletion:
        choices = [
            ChatChoice(
                index=i,
                message=ChatCompletionMessage(role="assistant", content=r.text),
                finish_reason=finish_reason(r),
                logprobs=self._logprobs(r.logprobs, ChoiceLogprobs),
                **self._token_ids(r),
            )
            for i, r in enumerate(results)
        ]
        return ChatCompletion(
            id=self.id,
            object="chat.completion",
            created=self.created,
            model=self.model,
            choices=choices,
            usage=usage(results, self.n),
            **self._prompt_ids(),
        )

    def _chunk(self, choices: list[ChunkChoice], **extra: Any) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self.id, object="chat.completion.chunk", created=self.created, model=self.model, choices=choices, **extra
        )

    def chunks(self, index: int, delta: GenerationDelta | None) -> list[ChatCompletionChunk]:
        """A content delta (with its tokens' log probabilities, and ids, where asked for); the first of each choice
        is preceded by the assistant role, as OpenAI sends it (with the prompt's token ids where asked for)."""
        out = []
        if index not in self._started:
            self._started.add(index)
            role = ChoiceDelta(role="assistant", content="")
            choice = ChunkChoice(index=index, delta=role, finish_reason=None, logprobs=None)
            out.append(self._chunk([choice], **self._prompt_ids()))
        ids = self._token_ids(delta)
        if delta is not None and (delta.text or delta.logprobs or ids.get("token_ids")):
            logprobs = self._logprobs(delta.logprobs, ChunkLogprobs)
            content = ChoiceDelta(content=delta.text)
            choice = ChunkChoice(index=index, delta=content, finish_reason=None, logprobs=logprobs, **ids)
            out.append(self._chunk([choice]))
        return out

    def final_chunks(self, index: int, result: GenerationResult) -> list[ChatCompletionChunk]:
        ids = self._token_ids(None)  # every id came with the deltas
        done = ChunkChoice(index=index, delta=ChoiceDelta(), finish_reason=finish_reason(result), logprobs=None, **ids)
        return [*self.chunks(index, None), self._chunk([done])]

    def usage_chunk(self, results: Sequence[GenerationResult]) -> ChatCompletionChunk:
        return self._chunk([], usage=usage(results, self.n))
