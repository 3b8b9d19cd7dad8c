"""``POST /v1/responses``'s request (OpenAI's shape): input items, instructions, function tools and
``text.format``, as the chat completions body it runs as after a stored conversation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ...errors import RequestError
from ..common import OriginFields
from ..fields import OpenAIModel
from ..types import Refusal, Text

PARAMS = {
    "max_tokens": "max_output_tokens",
    "response_format": "text.format",
    "messages": "input",
    "reasoning_effort": "reasoning.effort",
}
"""The Responses field a chat field a refusal names comes from."""


class Part(BaseModel):
    """A part of an input message's content; text parts only (``input_text``, ``output_text``)."""

    model_config = ConfigDict(extra="allow")

    type: str
    text: Text | None = None


class InputItem(OpenAIModel):
    """One item of ``input``: a message (``type`` ``message``, or left out), a ``function_call`` the model made, or
    a ``function_call_output`` answering it; ``reasoning`` items are dropped (as vLLM does)."""

    type: str = "message"
    role: Literal["user", "system", "developer", "assistant"] | None = None
    content: Text | list[Part] | None = None
    call_id: Text | None = None
    name: Text | None = None
    arguments: Text | None = None
    output: Text | list[Part] | None = None
    id: Text | None = None


class FunctionTool(OpenAIModel):
    """A tool as the Responses API gives it (its function's fields at the top)."""

    type: str
    name: Text | None = None
    description: Text | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class TextFormat(OpenAIModel):
    type: Literal["text", "json_object", "json_schema"]
    name: Text | None = None
    description: Text | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(OpenAIModel):
    format: TextFormat | None = None
    verbosity: Text | None = None


def _text(content: str | list[Part] | None, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    for j, part in enumerate(content):
        if part.text is None or part.type not in ("input_text", "output_text", "text"):
            raise RequestError(f"content part type '{part.type}' is not supported", param=f"{where}[{j}].type")
    return "".join(part.text or "" for part in content)


class ResponsesRequest(OriginFields, OpenAIModel):
    """OpenAI ``POST /v1/responses``; ``reasoning.effort`` and vLLM's ``chat_template_kwargs`` reach the chat
    template, as vLLM's server passes them. Accepted and ignored where they mean nothing here: ``metadata``,
    the rest of ``reasoning``, ``include``, ``truncation``, ``service_tier``, ``max_tool_calls``,
    ``prompt_cache_*``, ``safety_identifier``, ``context_management``, ``access_programs``."""

    model: Text | None = None
    input: Text | list[InputItem]
    instructions: Text | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: Text | None = None
    metadata: dict[str, Text] | None = None
    reasoning: dict[str, Any] | None = None
    include: list[Text] | None = None
    truncation: Text | None = None
    service_tier: Text | None = None
    max_tool_calls: int | None = None
    top_logprobs: int | None = None
    background: bool | None = None
    conversation: Any = None
    prompt: dict[str, Any] | None = None
    prompt_cache_key: Text | None = None
    prompt_cache_options: dict[str, Any] | None = None
    prompt_cache_retention: Text | None = None
    safety_identifier: Text | None = None
    stream_options: dict[str, Any] | None = None
    moderation: dict[str, Any] | None = None
    image: dict[str, Any] | None = None
    context_management: list[dict[str, Any]] | None = None
    access_programs: dict[str, Any] | None = None
    background_options: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's

    def refusals(self) -> list[Refusal]:
        out = []
        if self.background:
            out.append(("background", "background responses are not supported"))
        if self.conversation is not None:
            out.append(("conversation", "conversations are not supported; use previous_response_id"))
        if self.prompt is not None:
            out.append(("prompt", "stored prompts are not supported"))
        if self.moderation:
            out.append(("moderation", "moderation is not supported by this server"))
        if self.image:
            out.append(("image", "image output is not supported"))
        if self.top_logprobs:
            out.append(("top_logprobs", "log probabilities are not supported on /v1/responses"))
        for i, tool in enumerate(self.tools or []):
            if tool.type != "function" or not tool.name:
                out.append((f"tools[{i}].type", f"only function tools are supported, not '{tool.type}'"))
        return out

    def messages(self) -> list[dict[str, Any]]:
        """``input`` as chat messages: a function call the model made becomes an assistant message's tool call (calls
        in a row, one message), its output a ``tool`` message."""
        if isinstance(self.input, str):
            return [{"role": "user", "content": self.input}]
        out: list[dict[str, Any]] = []
        for i, item in enumerate(self.input):
            where = f"input[{i}]"
            if item.type == "message":
                if item.role is None:
                    raise RequestError("a message needs its role", param=f"{where}.role")
                out.append({"role": item.role, "content": _text(item.content, f"{where}.content")})
            elif item.type == "function_call":
                call = {
                    "id": item.call_id,
                    "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments},
                }
                if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls") and not out[-1]["content"]:
                    out[-1]["tool_calls"].append(call)
                else:
                    out.append({"role": "assistant", "content": None, "tool_calls": [call]})
            elif item.type == "function_call_output":
                out.append(
                    {"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output, f"{where}.output")}
                )
            elif item.type != "reasoning":
                raise RequestError(f"input item type '{item.type}' is not supported", param=f"{where}.type")
        return out

    def chat_body(self, history: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """The chat completions body this request runs as, after ``history`` (the stored conversation its
        ``previous_response_id`` ended; its instructions are not carried over, as OpenAI's are not)."""
        if refused := self.refusals():
            raise RequestError("; ".join(why for _, why in refused), param=refused[0][0])
        system = [{"role": "system", "content": self.instructions}] if self.instructions else []
        body: dict[str, Any] = {"messages": [*system, *history, *self.messages()], "stream": self.stream}
        for name in ("model", "temperature", "top_p", "parallel_tool_calls", "user", "priority"):
            if name in self.model_fields_set:
                body[name] = getattr(self, name)
        if self.max_output_tokens is not None:
            body["max_tokens"] = self.max_output_tokens
        if self.chat_template_kwargs:
            body["chat_template_kwargs"] = self.chat_template_kwargs
        if isinstance(self.reasoning, dict) and self.reasoning.get("effort") is not None:
            body["reasoning_effort"] = self.reasoning["effort"]  # for the template, as vLLM's server passes it
        if self.tools:
            body["tools"] = [
                {"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)} for t in self.tools
            ]
        if isinstance(self.tool_choice, dict):
            body["tool_choice"] = {"type": "function", "function": {"name": self.tool_choice.get("name")}}
        elif self.tool_choice is not None:
            body["tool_choice"] = self.tool_choice
        form = self.text.format if self.text else None
        if form is not None and form.type == "json_schema":
            schema = {"name": form.name or "output", "schema": form.schema_, "strict": form.strict}
            body["response_format"] = {"type": "json_schema", "json_schema": schema}
        elif form is not None and form.type == "json_object":
            body["response_format"] = {"type": "json_object"}
        return body


def responses_error(exc: RequestError) -> RequestError:
    """A chat path's refusal, naming the Responses field it comes from."""
    head, bracket, rest = (exc.param or "").partition("[")
    if head in PARAMS:
        exc.param = PARAMS[head] + bracket + rest
    return exc
