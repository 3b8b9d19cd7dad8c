"""``POST /v1/chat/completions``'s request: OpenAI's body (plus vLLM's chat extensions), its messages and tools, and
what of it is refused."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .. import tools
from ..common import OpenAIRequest
from ..fields import GENERATION_EXTENSIONS, OpenAIModel
from ..tools import ChatTool, MessageToolCall, ToolChoice
from ..types import Refusal, Text


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
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: Text | None = None
    refusal: Text | None = None

    def text(self) -> str:
        """The content as one string (text parts joined); other parts are refused."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text or "" for part in self.content)

    def template_input(self) -> dict[str, Any]:
        """The message as the chat template takes it: text content, and its tool calls or the call it answers."""
        out: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.tool_calls:
            out["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


def message_refusals(messages: Sequence[ChatMessage]) -> list[Refusal]:
    """What in chat messages a text-only model cannot take: a content part other than text."""
    out = []
    for i, message in enumerate(messages):
        for j, part in enumerate(message.content if isinstance(message.content, list) else ()):
            if part.type != "text" or part.text is None:
                out.append((f"messages[{i}].content[{j}]", f"content part type '{part.type}' is not supported"))
    return out


class TemplateFields(BaseModel):
    """vLLM's arguments of a chat template call: whether the prompt ends with the assistant's generation prompt or
    leaves the last message open for the model to continue (a prefilled answer), and the template's own variables
    (``{"enable_thinking": false}`` for a reasoning model's template)."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None

    def template_kwargs(self) -> dict[str, Any]:
        """The template call's arguments, merged as vLLM's server merges them (its own switches win)."""
        switches = {"add_generation_prompt": self.add_generation_prompt}
        switches["continue_final_message"] = self.continue_final_message
        return {**(self.chat_template_kwargs or {}), **switches}

    def template_refusals(self) -> list[Refusal]:
        """What vLLM's server refuses of them, in its words."""
        out = []
        if self.add_generation_prompt and self.continue_final_message:
            why = "cannot set both continue_final_message and add_generation_prompt to True"
            out.append(("continue_final_message", why))
        if reserved := sorted({"chat_template", "tokenize"} & (self.chat_template_kwargs or {}).keys()):
            out.append(("chat_template_kwargs", f"unexpected chat template kwargs: {', '.join(reserved)}"))
        return out


class ChatCompletionRequest(TemplateFields, OpenAIRequest):
    """OpenAI ``POST /v1/chat/completions``; ``max_completion_tokens`` is ``max_tokens`` under its newer name."""

    VLLM_EXTENSIONS: ClassVar[Mapping[str, Any]] = {
        **GENERATION_EXTENSIONS,
        "add_special_tokens": False,
        "chat_template": None,
        "documents": None,
        "echo": False,
        "media_io_kwargs": None,
        "mm_processor_kwargs": None,
        "return_prompt_text": None,
    }

    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[ChatTool] | None = None
    tool_choice: ToolChoice | None = None
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
    include_reasoning: bool = True  # vLLM's

    @model_validator(mode="after")
    def _newer_name(self) -> ChatCompletionRequest:
        if self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        return self

    def refusals(self) -> list[Refusal]:
        out = super().refusals()
        if self.top_logprobs and not self.logprobs:
            out.append(("top_logprobs", "top_logprobs needs logprobs: true"))
        out += tools.refusals(self.tools, self.tool_choice)
        formatted = self.response_format is not None and self.response_format.type != "text"
        if self.tool_mode in ("required", "named") and (formatted or self.structured_outputs):
            field = "response_format" if formatted else "structured_outputs"
            out.append((field, f"tool_choice {self.tool_mode!r} is structured output itself: set one of the two"))
        if self.functions or self.function_call not in (None, "none", "auto"):
            out.append(("functions", "the deprecated functions are not supported; use tools"))
        if (self.modalities and "audio" in self.modalities) or self.audio:
            out.append(("audio", "audio output is not supported"))
        if self.prediction:
            out.append(("prediction", "predicted outputs are not supported"))
        if self.web_search_options:
            out.append(("web_search_options", "web search is not supported"))
        if self.moderation:
            out.append(("moderation", "moderation is not supported by this server"))
        return out + self.template_refusals() + message_refusals(self.messages)

    def template_kwargs(self) -> dict[str, Any]:
        """:class:`TemplateFields`'s, with ``reasoning_effort`` for a template that reads it, as vLLM's server passes
        it; a reasoning template's ``enable_thinking`` follows it where the request does not set that itself."""
        out = super().template_kwargs()
        if self.reasoning_effort is not None:
            out["reasoning_effort"] = self.reasoning_effort
            if "enable_thinking" not in (self.chat_template_kwargs or {}):
                out["enable_thinking"] = self.reasoning_effort != "none"
        return out

    def logprob_counts(self) -> tuple[int | None, int | None]:
        return ((self.top_logprobs or 0) if self.logprobs else None), self.prompt_logprobs

    def conversation(self) -> list[dict[str, Any]]:
        """The messages as the chat template takes them (:meth:`ChatMessage.template_input`)."""
        return [m.template_input() for m in self.messages]

    @property
    def tool_mode(self) -> tools.Mode:
        return tools.mode(self.tools, self.tool_choice)

    def tool_dicts(self) -> list[dict[str, Any]] | None:
        """The tools for the chat template, with ``tool_choice: none`` too (as vLLM's server renders them)."""
        return tools.shown(self.tools)
