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
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
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

    named_events = True  # each stream event is named by its type ("event: response.created")

    def __init__(self, body: ResponsesRequest, chat: ChatFormat, response_id: str | None = None) -> None:
        """``response_id``: the Response's id (the caller's, which may say where it was made); default a random one."""
        self.body, self.chat = body, chat
        self.id, self.created = response_id or _id("resp"), int(time.time())
        self.final: Response | None = None
        self._sequence = 0
        self._open: dict[str, tuple[int, Any]] = {}  # "reasoning" / "message": output index and item
        self._said = {"reasoning": "", "message": ""}
        self._items: list[Any] = []
        self._calls: dict[int, tuple[int, ResponseFunctionToolCall]] = {}  # calls streaming: output index, item

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
            answer = self.chat.response(results)
            message = answer.choices[0].message
            details = answer.usage.completion_tokens_details if answer.usage else None
            thoughts = (message.model_extra or {}).get("reasoning")
            output: list[Any] = []
            if thoughts:
                output.append(self._reasoning_item(thoughts))
            if message.content:
                output.append(self._message_item(message.content, result.finish_reason))
            output += [self._call_item(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or []]
            self.final = self._response(_status(result), output, self._usage(result, details))
        return self.final

    def _usage(self, result: GenerationResult, details: Any) -> ResponseUsage:
        """The Response's usage: the result's tokens, how many of its prompt's the prefix cache held and how many
        it wrote there, and how many were thoughts (the chat usage's ``details``)."""
        cache = {"cached_tokens": result.cached_tokens or 0, "cache_write_tokens": result.cache_write_tokens or 0}
        return ResponseUsage(
            input_tokens=result.prompt_tokens,
            input_tokens_details=cache,
            output_tokens=result.output_tokens,
            output_tokens_details={"reasoning_tokens": (details.reasoning_tokens or 0) if details else 0},
            total_tokens=result.prompt_tokens + result.output_tokens,
        )

    def _reasoning_item(self, text: str, item_id: str | None = None) -> ResponseReasoningItem:
        content = [{"type": "reasoning_text", "text": text}]
        return ResponseReasoningItem(id=item_id or _id("rs"), type="reasoning", summary=[], content=content)

    def _message_item(self, text: str, reason: str, item_id: str | None = None) -> ResponseOutputMessage:
        status = "incomplete" if reason == "length" else "completed"
        part = ResponseOutputText(type="output_text", text=text, annotations=[])
        return ResponseOutputMessage(
            id=item_id or _id("msg"), type="message", role="assistant", status=status, content=[part]
        )

    def _call_item(
        self, call_id: str, name: str, arguments: str, status: str = "completed"
    ) -> ResponseFunctionToolCall:
        return ResponseFunctionToolCall(
            id=_id("fc"), type="function_call", call_id=call_id, name=name, arguments=arguments, status=status
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
        """Events for the chat path's chunks: their thoughts, text and calls' arguments as deltas in their items."""
        out = []
        for chunk in chunks:
            for choice in chunk.choices:
                thoughts = (choice.delta.model_extra or {}).get("reasoning")
                if thoughts:
                    out += self._delta("reasoning", thoughts)
                if choice.delta.content:
                    out += self._delta("message", choice.delta.content)
                for piece in choice.delta.tool_calls or []:
                    out += self._call_piece(piece)
        return out

    def _call_piece(self, piece: Any) -> list[BaseModel]:
        """A piece of a function call (OpenAI's chat delta shape): the first opens the call's item, after the
        thoughts and text before it; each adds to its arguments."""
        out: list[BaseModel] = []
        if piece.index not in self._calls:
            for kind in ("reasoning", "message"):
                if kind in self._open:
                    out += self._close(kind)
            index = len(self._items) + len(self._open) + len(self._calls)
            name = piece.function.name if piece.function else ""
            item = self._call_item(piece.id or _id("call"), name or "", "", status="in_progress")
            self._calls[piece.index] = (index, item)
            added = self._event(
                ResponseOutputItemAddedEvent, type="response.output_item.added", output_index=index, item=item
            )
            out.append(added.model_copy(deep=True))  # the item grows after the event is sent
        index, item = self._calls[piece.index]
        arguments = piece.function.arguments if piece.function else None
        if arguments:
            item.arguments += arguments
            delta = {"item_id": item.id, "output_index": index, "delta": arguments}
            out.append(
                self._event(
                    ResponseFunctionCallArgumentsDeltaEvent, type="response.function_call_arguments.delta", **delta
                )
            )
        return out

    def _close_call(self, key: int) -> list[BaseModel]:
        index, item = self._calls.pop(key)
        done = item.model_copy(update={"status": "completed"})
        self._items.append(done)
        where = {"item_id": item.id, "output_index": index}
        return [
            self._event(
                ResponseFunctionCallArgumentsDoneEvent,
                type="response.function_call_arguments.done",
                arguments=item.arguments,
                **where,
            ),
            self._event(ResponseOutputItemDoneEvent, type="response.output_item.done", output_index=index, item=done),
        ]

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
        """The items still open closed in their order, then ``response.completed`` with the Response
        (``response.incomplete`` where ``max_output_tokens`` cut it)."""
        out = self.chunks(index, None) + self._read(self.chat.final_chunks(index, result))
        still_open = [(at, kind) for kind, (at, _) in self._open.items()] + [
            (at, k) for k, (at, _) in self._calls.items()
        ]
        for _, key in sorted(still_open):
            out += self._close(key, result.finish_reason) if isinstance(key, str) else self._close_call(key)
        # the streamed items, with their ids; the usage as the chat usage counts it (the output is not read again)
        details = self.chat.token_usage([result]).completion_tokens_details
        self.final = self._response(_status(result), self._items, self._usage(result, details))
        if self.final.status == "incomplete":
            out.append(self._event(ResponseIncompleteEvent, type="response.incomplete", response=self.final))
        else:
            out.append(self._event(ResponseCompletedEvent, type="response.completed", response=self.final))
        return out

    def usage_chunk(self, results: Sequence[GenerationResult]) -> None:
        return None


def _status(result: GenerationResult) -> str:
    """A Response's status: ``incomplete`` where ``max_output_tokens`` cut it."""
    return "incomplete" if result.finish_reason == "length" else "completed"
