"""The chat path's answer as a Response object and its stream of events (OpenAI's types)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCreatedEvent,
    ResponseFunctionToolCall,
    ResponseIncompleteEvent,
    ResponseInProgressEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
    ResponseReasoningTextDeltaEvent,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
    ResponseUsage,
)
from pydantic import BaseModel

from ...engines import GenerationDelta, GenerationResult
from ..chat import ChatFormat
from .request import ResponsesRequest


def answer_turn(response: Response) -> dict[str, Any]:
    """A Response's output as the assistant's chat message (its thoughts left out, as a chat history has them)."""
    text = "".join(
        p.text for item in response.output if item.type == "message" for p in item.content if p.type == "output_text"
    )
    calls = [
        {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
        for item in response.output
        if item.type == "function_call"
    ]
    return {"role": "assistant", "content": text or None, **({"tool_calls": calls} if calls else {})}


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponsesFormat:
    """A Response and its stream events for one request, from the chat path's answer (``chat``: its
    :class:`ChatFormat`): reasoning, then the message, then the function calls, as output items."""

    def __init__(self, body: ResponsesRequest, chat: ChatFormat) -> None:
        self.body, self.chat = body, chat
        self.id, self.created = _id("resp"), int(time.time())
        self.final: Response | None = None
        self._sequence = 0
        self._open: dict[str, tuple[int, Any]] = {}  # "reasoning" / "message": output index and item
        self._said = {"reasoning": "", "message": ""}
        self._items: list[Any] = []
        self._calls: dict[int, dict[str, str]] = {}  # the calls streamed, by index

    def _response(self, status: str, output: Sequence[Any], usage: ResponseUsage | None = None) -> Response:
        body = self.body
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return Response(
            id=self.id,
            object="response",
            created_at=self.created,
            model=self.chat.model,
            status=status,
            output=list(output),
            incomplete_details=incomplete,
            instructions=body.instructions,
            max_output_tokens=body.max_output_tokens,
            metadata=body.metadata,
            parallel_tool_calls=body.parallel_tool_calls is not False,
            previous_response_id=body.previous_response_id,
            temperature=body.temperature,
            top_p=body.top_p,
            tool_choice=body.tool_choice or "auto",
            tools=[t.model_dump(exclude_none=True) for t in body.tools or []],
            text=body.text.model_dump(by_alias=True, exclude_none=True) if body.text else None,
            usage=usage,
            user=body.user,
        )

    def response(self, results: Sequence[GenerationResult]) -> Response:
        """The whole Response (built once: the route stores this one)."""
        if self.final is None:
            (result,) = results
            message = self.chat.response(results).choices[0].message
            thoughts = (message.model_extra or {}).get("reasoning")
            output: list[Any] = []
            if thoughts:
                output.append(self._reasoning_item(thoughts))
            if message.content:
                output.append(self._message_item(message.content, result.finish_reason))
            output += [self._call_item(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or []]
            status = "incomplete" if result.finish_reason == "length" else "completed"
            usage = ResponseUsage(
                input_tokens=result.prompt_tokens,
                input_tokens_details={"cached_tokens": 0, "cache_write_tokens": 0},
                output_tokens=result.output_tokens,
                output_tokens_details={"reasoning_tokens": 0},
                total_tokens=result.prompt_tokens + result.output_tokens,
            )
            self.final = self._response(status, output, usage)
        return self.final

    def _reasoning_item(self, text: str, item_id: str | None = None) -> ResponseReasoningItem:
        content = [{"type": "reasoning_text", "text": text}]
        return ResponseReasoningItem(id=item_id or _id("rs"), type="reasoning", summary=[], content=content)

    def _message_item(self, text: str, reason: str, item_id: str | None = None) -> ResponseOutputMessage:
        status = "incomplete" if reason == "length" else "completed"
        part = ResponseOutputText(type="output_text", text=text, annotations=[])
        return ResponseOutputMessage(
            id=item_id or _id("msg"), type="message", role="assistant", status=status, content=[part]
        )

    def _call_item(self, call_id: str, name: str, arguments: str) -> ResponseFunctionToolCall:
        return ResponseFunctionToolCall(
            id=_id("fc"), type="function_call", call_id=call_id, name=name, arguments=arguments, status="completed"
        )

    # -- The stream ----------------------------------------------------------------------------------------------

    def _event(self, kind: type[BaseModel], **fields: Any) -> BaseModel:
        self._sequence += 1
        return kind(sequence_number=self._sequence - 1, **fields)

    def chunks(self, index: int, delta: GenerationDelta | None) -> list[BaseModel]:
        """The events a delta makes: the response's start first, then reasoning and text deltas in their items."""
        out = []
        if self._sequence == 0:
            started = self._response("in_progress", [])
            out += [self._event(ResponseCreatedEvent, type="response.created", response=started)]
            out += [self._event(ResponseInProgressEvent, type="response.in_progress", response=started)]
        return out + self._read(self.chat.chunks(index, delta))

    def _read(self, chunks: Sequence[Any]) -> list[BaseModel]:
        """Events for the chat path's chunks: their thoughts and text as deltas; pieces of calls put together (a
        call is an item whole, at the end)."""
        out = []
        for chunk in chunks:
            for choice in chunk.choices:
                thoughts = (choice.delta.model_extra or {}).get("reasoning")
                if thoughts:
                    out += self._delta("reasoning", thoughts)
                if choice.delta.content:
                    out += self._delta("message", choice.delta.content)
                for piece in choice.delta.tool_calls or []:
                    call = self._calls.setdefault(piece.index, {"id": piece.id, "name": "", "arguments": ""})
                    call["name"] += piece.function.name or "" if piece.function else ""
                    call["arguments"] += piece.function.arguments or "" if piece.function else ""
        return out

    def _delta(self, kind: str, text: str) -> list[BaseModel]:
        out = []
        if kind == "message" and "reasoning" in self._open:
            out += self._close("reasoning")
        if kind not in self._open:
            index = len(self._items) + len(self._open)
            item = self._reasoning_item("") if kind == "reasoning" else self._message_item("", "")
            item.status = "in_progress"
            self._open[kind] = (index, item)
            out.append(
                self._event(
                    ResponseOutputItemAddedEvent, type="response.output_item.added", output_index=index, item=item
                )
            )
            if kind == "message":
                part = ResponseOutputText(type="output_text", text="", annotations=[])
                out.append(
                    self._event(
                        ResponseContentPartAddedEvent,
                        type="response.content_part.added",
                        item_id=item.id,
                        output_index=index,
                        content_index=0,
                        part=part,
                    )
                )
        index, item = self._open[kind]
        self._said[kind] += text
        if kind == "reasoning":
            where = {"item_id": item.id, "output_index": index, "content_index": 0}
            out.append(
                self._event(ResponseReasoningTextDeltaEvent, type="response.reasoning_text.delta", delta=text, **where)
            )
        else:
            where = {"item_id": item.id, "output_index": index, "content_index": 0}
            out.append(
                self._event(ResponseTextDeltaEvent, type="response.output_text.delta", delta=text, logprobs=[], **where)
            )
        return out

    def _close(self, kind: str, reason: str = "stop") -> list[BaseModel]:
        index, item = self._open.pop(kind)
        text = self._said[kind]
        out = []
        if kind == "message":
            where = {"item_id": item.id, "output_index": index, "content_index": 0}
            out.append(
                self._event(ResponseTextDoneEvent, type="response.output_text.done", text=text, logprobs=[], **where)
            )
            part = ResponseOutputText(type="output_text", text=text, annotations=[])
            out.append(self._event(ResponseContentPartDoneEvent, type="response.content_part.done", part=part, **where))
            done = self._message_item(text, reason, item.id)
        else:
            done = self._reasoning_item(text, item.id)
        self._items.append(done)
        out.append(
            self._event(ResponseOutputItemDoneEvent, type="response.output_item.done", output_index=index, item=done)
        )
        return out

    def final_chunks(self, index: int, result: GenerationResult) -> list[BaseModel]:
        """The items still open closed, the function calls as whole items, then ``response.completed`` with the
        Response (``response.incomplete`` where ``max_output_tokens`` cut it)."""
        out = self.chunks(index, None) + self._read(self.chat.final_chunks(index, result))
        for kind in ("reasoning", "message"):
            if kind in self._open:
                out += self._close(kind, result.finish_reason)
        for call in (self._calls[k] for k in sorted(self._calls)):
            item = self._call_item(call["id"], call["name"], call["arguments"])
            for event, kind in (("added", ResponseOutputItemAddedEvent), ("done", ResponseOutputItemDoneEvent)):
                out.append(
                    self._event(kind, type=f"response.output_item.{event}", output_index=len(self._items), item=item)
                )
            self._items.append(item)
        whole = self.response([result])
        self.final = whole.model_copy(update={"output": self._items})  # the streamed items, with their ids
        if self.final.status == "incomplete":
            out.append(self._event(ResponseIncompleteEvent, type="response.incomplete", response=self.final))
        else:
            out.append(self._event(ResponseCompletedEvent, type="response.completed", response=self.final))
        return out

    def usage_chunk(self, results: Sequence[GenerationResult]) -> None:
        return None
