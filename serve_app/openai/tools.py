"""Tool calling on ``/v1/chat/completions``: OpenAI's ``tools``, ``tool_choice`` and the tool calls of assistant
messages, and the calls read back from a model's output. A forced call (``tool_choice`` ``required`` or a named
function) is structured output, as vLLM's server does it, so any model returns a call: in the model's own format
where vLLM's tool parser forces it so (a structural tag), read back as ``auto``'s calls are, else as vLLM's JSON list
of calls. ``auto`` reads the model's own call format with vLLM's tool parser (the app's ``vllm.tool_call_parser``)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any, Literal

from openai.types.chat import ChatCompletionMessageFunctionToolCall
from openai.types.chat.chat_completion_message_function_tool_call import Function
from pydantic import Field, TypeAdapter, ValidationError

from .fields import OpenAIModel
from .types import Refusal, Text


class FunctionDefinition(OpenAIModel):
    name: Text = Field(..., min_length=1, max_length=64)
    description: Text | None = None
    parameters: dict[str, Any] | None = Field(None, description="the arguments' JSON schema")
    strict: bool | None = None


class ChatTool(OpenAIModel):
    """One tool the model may call: a function."""

    type: Literal["function"] = "function"
    function: FunctionDefinition


class FunctionName(OpenAIModel):
    name: Text


class NamedToolChoice(OpenAIModel):
    """``tool_choice`` naming the function the model must call."""

    type: Literal["function"] = "function"
    function: FunctionName


class CalledFunction(OpenAIModel):
    name: Text
    arguments: Text = Field(..., description="the arguments as JSON text")


class MessageToolCall(OpenAIModel):
    """A call in an assistant message of the history, as a previous answer gave it."""

    id: Text
    type: Literal["function"] = "function"
    function: CalledFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice

Mode = Literal["none", "auto", "required", "named"]


def mode(tools: list[ChatTool] | None, choice: ToolChoice | None) -> Mode:
    """How a request uses tools: OpenAI's default is ``auto`` with tools and ``none`` without."""
    if not tools or choice == "none":
        return "none"
    if isinstance(choice, NamedToolChoice):
        return "named"
    return choice or "auto"


def shown(tools: list[ChatTool] | None) -> list[dict[str, Any]] | None:
    """The tools as the chat template shows them to the model (None: no tools)."""
    return [tool.model_dump(exclude_none=True) for tool in tools] if tools else None


def refusals(tools: list[ChatTool] | None, choice: ToolChoice | None) -> list[Refusal]:
    """A ``tool_choice`` that needs tools without them, or names one that is not among them (vLLM's checks)."""
    if choice in (None, "none"):
        return []
    if not tools:
        return [("tool_choice", "tool_choice needs tools")]
    if isinstance(choice, NamedToolChoice) and choice.function.name not in {t.function.name for t in tools}:
        return [("tool_choice", f"the function '{choice.function.name}' is not among the tools")]
    return []


def output_schema(tools: list[ChatTool], choice: ToolChoice | None, parallel: bool | None) -> dict[str, Any]:
    """What a forced call's output must match, with vLLM's own schema (``get_json_schema_from_tools``): the named
    function's arguments, or a list of ``{"name", "parameters"}`` calls (one at most where ``parallel`` is False)."""
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionNamedToolChoiceParam,
        ChatCompletionToolsParam,
    )
    from vllm.tool_parsers.utils import get_json_schema_from_tools

    vllm_tools = [ChatCompletionToolsParam.model_validate(tool.model_dump(exclude_none=True)) for tool in tools]
    vllm_choice = (
        ChatCompletionNamedToolChoiceParam.model_validate(choice.model_dump())
        if isinstance(choice, NamedToolChoice)
        else choice
    )
    schema = get_json_schema_from_tools(vllm_choice, vllm_tools, parallel)
    return json.loads(schema) if isinstance(schema, str) else schema


class _ForcedCall(OpenAIModel):
    name: str
    parameters: dict[str, Any]


_FORCED_CALLS = TypeAdapter(list[_ForcedCall])


def call(name: str, arguments: str) -> ChatCompletionMessageFunctionToolCall:
    return ChatCompletionMessageFunctionToolCall(
        id=f"chatcmpl-tool-{uuid.uuid4().hex}", type="function", function=Function(name=name, arguments=arguments)
    )


def forced_calls(text: str, how: Mode, name: str | None) -> list[ChatCompletionMessageFunctionToolCall] | None:
    """The calls a forced output holds: the named function with the output as its arguments, or the list of calls
    ``required`` asks for; None where the output is not one (it was cut short by ``max_tokens``)."""
    if how == "named":
        return [call(name or "", text)] if text.strip() else None
    try:
        calls = _FORCED_CALLS.validate_json(text)
    except ValidationError:
        return None
    return [call(c.name, json.dumps(c.parameters, ensure_ascii=False)) for c in calls] or None


Parse = Callable[[str], tuple[str | None, list[tuple[str, str]]]]
"""An engine's reader of a model's own call format: the output's content and its calls as ``(name, arguments)``."""


class ToolCalls:
    """How one request's answers are read for tool calls: ``auto`` with the engine's parser (``parse``), and a
    forced call (``named``, ``required``) with it too where the parser forced it in the model's own format, else
    from the output itself (vLLM's JSON)."""

    def __init__(self, how: Mode, name: str | None = None, parse: Parse | None = None) -> None:
        self.how, self.name, self.parse = how, name, parse

    @classmethod
    def of(cls, tool_mode: Mode, choice: ToolChoice | None, parse: Parse | None) -> ToolCalls | None:
        """A request's reader; None where it uses no tools (its output is its content)."""
        if tool_mode == "none":
            return None
        return cls(tool_mode, choice.function.name if isinstance(choice, NamedToolChoice) else None, parse)

    def read(self, text: str) -> tuple[str | None, list[ChatCompletionMessageFunctionToolCall]]:
        """The content and the tool calls of an output (no calls: the output is the content)."""
        if self.parse is not None:
            content, found = self.parse(text)
            return content, [call(name, arguments) for name, arguments in found]
        if self.how in ("named", "required"):
            calls = forced_calls(text, self.how, self.name)
            return (None, calls) if calls else (text, [])
        return text, []

    def answer(self, text: str, reason: str) -> tuple[str | None, list[ChatCompletionMessageFunctionToolCall], str]:
        """An output's content, its calls and the finish reason that goes with them (:meth:`read`,
        :meth:`finish_reason`); ``reason``: the output's own."""
        content, calls = self.read(text)
        return content, calls, self.finish_reason(calls, reason)

    def finish_reason(self, calls: list[Any], reason: str) -> str:
        """OpenAI's: ``tool_calls`` where the model chose to call (``auto``, ``required``), ``stop`` for a named
        function; the output's own ``reason`` where there is no call or it was cut short (``length``)."""
        if not calls or reason == "length":
            return reason
        return "stop" if self.how == "named" else "tool_calls"
